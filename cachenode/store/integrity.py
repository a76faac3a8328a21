"""Whether a stored object's bytes are still what was stored, and what
happens when they are not. Checked on every read of a small object (its
seal, cachenode/store/small.py), on a large one's blocks when asked
(cachenode/store/blocks.py: `--verify-reads`, the scrub, a copy).

A mixin of `Store` (cachenode/store/disk.py), as `TempFiles` is: a damaged
object leaves the index and its files go, through the store's own steps.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import structlog

from cachenode.store import blocks, small
from cachenode.store.index import Index
from cachenode.store.objects import Meta

log = structlog.get_logger("nezha.store")


class Integrity:
    """Needs of the class it is mixed into: `_index`, `_unlink_later(meta,
    final=)` and `corrupt(found_by)`."""

    _index: Index
    _unlink_later: Callable[..., asyncio.Future]
    corrupt: Callable[[str], None]

    def intact(self, meta: Meta, fd: int) -> bool:
        """Whether the open data file `fd` holds `meta`'s object whole. A large
        object's file was fsynced before its meta named it: it is. A small
        one's seal is checked (cachenode/store/small.py): a torn or damaged
        file is never served. Read-only: a follower worker asks it too."""
        return not small.is_sealed(meta) or small.check(fd, meta)

    @staticmethod
    def verify(meta: Meta, fd: int, start: int = 0, length: int | None = None) -> str | None:
        """Why the blocks of the open data file `fd` that bytes [start,
        start+length) touch are not `meta`'s (cachenode/store/blocks.py);
        None when they are, or when `meta` has no block checksum (a small
        object, whose seal `intact` checks, or one stored before there was
        one). Blocks: reads the blocks from disk or the page cache."""
        if not meta.blocks:
            return None
        try:
            blocks.check(fd, meta.size, meta.blocks, start=start, length=length)
        except blocks.BadBlocks as e:
            return str(e)
        return None

    def damaged(self, meta: Meta, *, found_by: str = "read", why: str = "") -> None:
        """`meta`'s file failed its check: forget it and delete the file, so the
        next request fetches the object again; counted as found by `found_by`."""
        held = self._index.get(meta.slot)
        if held is not None and held.data == meta.data:  # the same data file: the same object
            self._index.drop(meta.slot)
            self._unlink_later(meta, final=True)
            log.warning("object_damaged", key=meta.key, data=meta.data, found_by=found_by,
                        **({"why": why} if why else {}))
            self.corrupt(found_by)
