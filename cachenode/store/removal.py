"""Objects leaving the store: what the index evicted or found lost, what a
purge or an expiry removes, and their files deleted in the order of their
object's steps (cachenode/store/steps.py).

Apart from `Store` (cachenode/store/disk.py) because none of it writes an
object: it only takes objects out of the index and their files off the
disk. A mixin of `Store`, as `TempFiles` and `Integrity` are.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

import structlog

from cachenode.store import small
from cachenode.store.index import Index
from cachenode.store.layout import read_meta, vary_path, write_vary
from cachenode.store.loading import Loader
from cachenode.store.objects import Meta
from nezha.keys import object_id

log = structlog.get_logger("nezha.store")


class Removal:
    """Needs of the class it is mixed into: `_index`, `_loader`, `_on_evict`,
    `objects`, `tmp`, `_dir_of(oid)`, `_inside(path)`, `_step(oid, fn)`, `_load(key)` and `writer`."""

    _index: Index
    _loader: Loader | None
    _on_evict: Callable[[Meta], None] | None
    objects: Path
    tmp: Path
    _dir_of: Callable[[str], Path]
    _inside: Callable[[Path], Path]
    _step: Callable[[str, Callable[[], object]], asyncio.Future]
    _load: Callable[[str], None]
    writer: bool

    def _evicted(self, meta: Meta, reason: str) -> None:
        """The index evicted `meta`: its files go, and whoever listens is told."""
        self._unlink_later(meta, final=True)
        log.info("object_evicted", key=meta.key, bytes=meta.size, reason=reason,
                 **({"hot": True} if meta.hot else {}))
        if self._on_evict:
            self._on_evict(meta)

    def _lost(self, oid: str, data: str) -> None:
        """The index found an object's record gone or unreadable (deleted or
        damaged under the store): it left the index; its files go, by the
        writer's hand only. A follower's row may name a file the writer has
        replaced or is judging itself: the writer's own index says what goes."""
        log.warning("object_lost", oid=oid, data=data, **({} if self.writer else {"deleted": False}))
        if self.writer:
            self._unlink_files(oid, data, final=True)

    def _unlink_later(self, meta: Meta, *, final: bool) -> asyncio.Future:
        """Delete an evicted or replaced object's data (and, if `final`, its meta) soon;
        the note of its key's Vary names with the key's last variant."""
        if final and meta.vary and not self._index.slots_of(meta.key):
            self._note_vary(meta.key, None)
        return self._unlink_files(object_id(meta.slot), meta.data, final=final)

    def _note_vary(self, key: str, names: tuple[str, ...] | None) -> None:
        """Note (or, None, delete) under `key`'s own id the names its responses
        vary on, soon: how a lookup finds a variant before the start-up scan
        reached it (cachenode/store/loading.py). In the order of `key`'s steps."""
        path = self._inside(vary_path(self.objects, key))

        def note() -> None:
            try:
                if names is None:
                    path.unlink(missing_ok=True)
                else:
                    write_vary(self.objects, key, names, tmp=self.tmp)
            except OSError as e:
                log.warning("vary_note_failed", key=key, error=str(e))

        self._step(object_id(key), note)

    def _unlink_files(self, oid: str, data: str, *, final: bool) -> asyncio.Future:
        """Delete data file `data` of object `oid` (and, if `final`, its meta) soon.

        The meta goes only if it still names this data file: a commit of the
        same key queued before this step may already have replaced it.
        """
        d = self._dir_of(oid)
        data_path, meta_path = d / data, d / f"{oid}.meta"

        def unlink() -> None:
            paths = [data_path]
            if final and not data.endswith(small.SUFFIX):
                current = read_meta(meta_path)
                if current is None or current.data == data:
                    paths.append(meta_path)
            for p in paths:
                try:
                    self._inside(p).unlink(missing_ok=True)
                except OSError as e:
                    log.warning("unlink_failed", path=str(p), error=str(e))

        # Open readers keep their file descriptors; unlinking under them is safe.
        return self._step(oid, unlink)

    async def remove(self, key: str) -> list[Meta]:
        """Forget every stored response of `key`, variants included; what went.

        Returns once their data files are unlinked: a node's other workers
        (cachenode/workers/) may still hold the old entry in their copy of the
        index for a moment, and must find no file to open after a write that
        removed it has been answered."""
        self._load(key)
        if self._loader is not None:
            self._loader.removed(key)  # its variants in folders not scanned yet do not come back
        gone, steps = [], []
        for slot in self._index.slots_of(key):
            meta = self._index.drop(slot)
            if meta is not None:
                steps.append(self._unlink_later(meta, final=True))
                gone.append(meta)
        if steps:
            await asyncio.shield(asyncio.gather(*steps, return_exceptions=True))
        return gone

    async def remove_one(self, meta: Meta, *, reason: str | None = None) -> bool:
        """Forget the one stored response `meta` (its variant only), if still
        stored; returns once its data file is unlinked, as `remove` does.
        `reason` ("expired") counts it among the evictions."""
        held = self._index.get(meta.slot)
        # The same data file, not refreshed since: the same response (a record read again from disk is another Meta).
        if held is None or held.data != meta.data or held.stored_at != meta.stored_at:
            return False
        self._index.drop(meta.slot, reason=reason)
        await asyncio.shield(self._unlink_later(meta, final=True))
        return True
