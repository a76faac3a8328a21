"""What a store answers from its index alone: the stored keys, their sizes,
chunks and variants, the bytes held.

Apart from the index (cachenode/store/index.py) because it is the store's
face, not the index's bookkeeping: a mixin of `Store`
(cachenode/store/disk.py), which holds the index as `_index`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, AsyncIterator, Iterator

from cachenode.store.objects import Meta
from cachenode.store.rows import HOT

if TYPE_CHECKING:
    from cachenode.store.index import Index


class Slots:
    """The keys stored (`key in index.slots`); iterating reads every record."""

    def __init__(self, index: Index) -> None:
        self._index = index

    def __contains__(self, key: str) -> bool:
        return self._index.has(key) or self._index.varies(key)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(m.key for m in self._index.metas()))


class IndexView:
    """What a store answers from its index alone (cachenode/store/disk.py `Store`)."""

    _index: Index

    def __contains__(self, key: str) -> bool:
        return key in self._index.slots

    def keys(self) -> list[str]:
        """Every stored key: reads every record (a test's or a tool's question, not the hot path's)."""
        return list(self._index.slots)

    def stored_size(self, key: str) -> int | None:
        """The bytes `key`'s stored responses hold here (all its variants); None when none is stored."""
        sizes = [s for s in map(self._index.size_of, self._index.slots_of(key)) if s is not None]
        return sum(sizes) if sizes else None

    def chunks_of(self, key: str) -> list[str]:
        """The keys of the chunks of the object `key` stored here, of any chunk size or version."""
        return self._index.chunks_of(key)

    def metas(self) -> list[Meta]:
        """Every stored response, variants included (the records of objects on disk are read)."""
        return self._index.metas()

    def each_meta(self, *, hot: bool = True) -> AsyncIterator[Meta]:
        """Every stored response, its record read in the executor: for a walk over all of them.
        `hot=False`: hot copies are passed over, their records not read."""
        return self._index.each_meta(skip=0 if hot else HOT)

    def count(self, *, hot: bool = True) -> int:
        """Objects stored, from the index's rows alone; `hot=False`: hot copies not counted."""
        return self._index.count(skip=0 if hot else HOT)

    @property
    def used_bytes(self) -> int:
        return self._index.usage.stored

    @property
    def hot_bytes(self) -> int:
        """Bytes of hot copies stored (part of `used_bytes`)."""
        return self._index.usage.hot

    @property
    def _usage(self):
        return self._index.usage

    def __len__(self) -> int:
        return len(self._index)

    def varies(self, key: str) -> bool:
        """Whether responses that vary are stored for `key`, from memory alone."""
        return self._index.varies(key)

    def vary_of(self, key: str) -> tuple[str, ...] | None:
        """The names `key`'s newest stored response varies on; None when it does not vary (or nothing is stored)."""
        return self._index.vary_of(key)

    def touch(self, slot: str) -> None:
        """A read of `slot` served elsewhere (another worker) counts as a use."""
        self._index.touch(slot)
