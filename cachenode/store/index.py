"""The store's in-memory index: which responses are stored, what they weigh,
and which goes first when room is needed.

Apart from the store's files (`store/disk.py`) because it touches no disk:
the store asks it what to evict and does the unlinking itself, through the
`evicted` callback it hands over at construction. Everything here runs on
the event loop only, so it needs no lock.

Order is least recently used first (`entries`, an OrderedDict). Hot copies
(`Meta.hot`, docs/cache-node.md "Hot copies") are a cache of the cache:
they hold at most the store's hot share (the least recently used hot copy
goes first beyond it), and whenever room is needed they are evicted before
any other object, least recently used first.

Usage counts the bytes stored and the bytes reserved by fills still
running: a fill of known size reserves its room before its bytes arrive,
so several fills at once cannot overshoot the capacity together.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from cachenode.http.vary import variant as variant_of
from cachenode.store.objects import VARIANT_SEPARATOR, Meta
from nezha.chunks import chunk_of


@dataclass
class Usage:
    stored: int = 0
    reserved: int = 0
    hot: int = 0  # of `stored`, bytes of hot copies


class Index:
    """slot -> Meta, in eviction order, with the bytes they and running fills hold.

    `evicted(meta)` is called for each object an eviction drops, after it
    left the index: the store deletes its files and tells whoever listens.
    """

    def __init__(self, *, evicted: Callable[[Meta], None], protected: Callable[[str], bool] = lambda key: False) -> None:
        self._evicted = evicted
        self._protected = protected  # a key eviction passes over (store/pins.py: pinned by a workload)
        self.entries: OrderedDict[str, Meta] = OrderedDict()  # slot -> meta, LRU order: oldest first
        self.slots: dict[str, set[str]] = {}  # key -> its slots (one, or one per stored variant)
        self._vary: dict[str, tuple[str, ...]] = {}  # key -> the names its newest response varies on
        # object key -> the keys of its chunks stored here (nezha/chunks.py): an
        # invalidated object's chunks are found without a manifest or a scan.
        self._chunks: dict[str, set[str]] = {}
        self._hot: OrderedDict[str, None] = OrderedDict()  # slots of hot copies, LRU order as in entries
        self.usage = Usage()
        # Told of every change to the index, in order: ("put", meta) and
        # ("drop", meta). A node's other workers follow the index this way
        # (cachenode/workers/), since only this process writes the store.
        self.watchers: list[Callable[[str, Meta], None]] = []

    # -- reads -------------------------------------------------------------
    def lookup(self, key: str, request_headers=None) -> Meta | None:
        """The stored response for `key` that a request with `request_headers`
        selects (RFC 9111 §4.1), counted as a use. Without headers, only a
        response that does not vary: who does not say what it asks for gets no variant."""
        names = self._vary.get(key)
        if names is None:
            slot = key
        elif request_headers is None:
            return None
        else:
            slot = f"{key}{VARIANT_SEPARATOR}{variant_of(names, request_headers)}"
        meta = self.entries.get(slot)
        if meta is not None:
            self.entries.move_to_end(slot)
            if meta.hot:
                self._hot.move_to_end(slot)
        return meta

    def get(self, slot: str) -> Meta | None:
        """The meta stored in `slot`, not counted as a use."""
        return self.entries.get(slot)

    def touch(self, slot: str) -> None:
        """A read of `slot` served elsewhere (another worker) counts as a use."""
        if slot in self.entries:
            self.entries.move_to_end(slot)
            if slot in self._hot:
                self._hot.move_to_end(slot)

    def chunks_of(self, key: str) -> list[str]:
        return sorted(self._chunks.get(key, ()))

    def __len__(self) -> int:
        return len(self.entries)

    # -- changes -----------------------------------------------------------
    def add(self, meta: Meta) -> None:
        self.entries[meta.slot] = meta
        for watch in self.watchers:
            watch("put", meta)
        self.usage.stored += meta.size
        if meta.hot:
            self._hot[meta.slot] = None
            self.usage.hot += meta.size
        self.slots.setdefault(meta.key, set()).add(meta.slot)
        if (chunk := chunk_of(meta.key)) is not None:
            self._chunks.setdefault(chunk[0], set()).add(meta.key)
        if meta.vary:
            self._vary[meta.key] = meta.vary
        else:
            self._vary.pop(meta.key, None)

    def replace(self, new: Meta) -> None:
        """`new` in place of the meta in its slot (same bytes: a refresh), keeping its place in the order."""
        self.entries[new.slot] = new
        for watch in self.watchers:
            watch("put", new)

    def drop(self, slot: str) -> Meta | None:
        meta = self.entries.pop(slot, None)
        if meta is None:
            return None
        for watch in self.watchers:
            watch("drop", meta)
        self.usage.stored -= meta.size
        if meta.hot:
            self._hot.pop(slot, None)
            self.usage.hot -= meta.size
        slots = self.slots.get(meta.key)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self.slots[meta.key]
                self._vary.pop(meta.key, None)
                if (chunk := chunk_of(meta.key)) is not None and (held := self._chunks.get(chunk[0])) is not None:
                    held.discard(meta.key)
                    if not held:
                        del self._chunks[chunk[0]]
        return meta

    # -- room ----------------------------------------------------------------
    def reserve(self, size: int) -> None:
        self.usage.reserved += size

    def release(self, size: int) -> None:
        self.usage.reserved = max(0, self.usage.reserved - size)

    def evict_to(self, limit: int, *, keep: str | None = None) -> None:
        """Evict least recently used objects until stored + reserved bytes fit `limit`.

        `keep` (the object just committed) goes last, and survives alone only
        while its own bytes fit: the reservations of fills still running may
        leave the total above the limit until they commit and evict in turn.
        """
        while self.usage.stored + self.usage.reserved > limit and self.entries:
            hot = next((slot for slot in self._hot if slot != keep), None)
            if hot is not None:  # a hot copy is a cache of the cache: it goes first
                self._evict(hot)
                continue
            # The least recently used object that is neither `keep` nor pinned (store/pins.py).
            key = next((slot for slot, meta in self.entries.items()
                        if slot != keep and not self._protected(meta.key)), None)
            if key is None:  # `keep` and pinned objects are all that is left
                if keep not in self.entries or self.usage.stored <= limit or self._protected(self.entries[keep].key):
                    break
                key = keep
            self._evict(key)

    def evict_hot_to(self, limit: int, *, keep: str | None = None) -> None:
        """Evict least recently used hot copies until theirs fit `limit`; `keep` last."""
        while self.usage.hot > limit and self._hot:
            slot = next((s for s in self._hot if s != keep), next(iter(self._hot)))
            self._evict(slot)

    def _evict(self, slot: str) -> None:
        meta = self.drop(slot)
        assert meta is not None
        self._evicted(meta)
