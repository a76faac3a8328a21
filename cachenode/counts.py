"""Counting what a node does, in its two books: Prometheus (this node's own
work) and the Redis index (per host, cluster-wide, docs/redis-schema.md).

One object so that every room counts the same way: the handler, the
responders, the fill engine and the store's evictions all hold this, not
the node. Index writes are batched there and never awaited here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from cachenode.metrics import Metrics
from nezha.chunks import chunk_of
from nezha.wire import PEER_PREFIX, CacheOutcome

if TYPE_CHECKING:
    from cachenode.store.objects import Meta
    from nezha.index.handle import Index

# Counted once per client request, by the node the client reached: a node
# answering a peer's internal request leaves these out of the index.
_REQUEST_FIELDS = frozenset({"hits", "misses", "peer_hits", "bytes_served"})
# Answers a fill from the origin stored before they were sent (a manifest, a
# fill that was whole first): sent from the store, needed the origin all the same.
_MISSES = frozenset({CacheOutcome.MISS, CacheOutcome.MISS_JOINED})
_UNSET = object()


def answer_counts(label: str) -> dict[str, int]:
    """What a stored object's answer labelled `label` (X-Nezha-Cache) counts
    as a request: a miss when a fill just stored it for this request, a hit
    otherwise, and nothing for a relayed label (`peer-...`: a chunked object
    read through a node that does not hold its manifest), which the relaying
    handler counts as the relay it is, bytes included (docs/redis-schema.md,
    "Statistics")."""
    if label.startswith(PEER_PREFIX):
        return {}
    return {"misses": 1} if label in _MISSES else {"hits": 1}


def stored_counts(meta: Meta, sign: int) -> dict[str, int]:
    """The gauge deltas of `meta` entering (+1) or leaving (-1) the store.
    A chunk weighs its bytes but is no object of its own: a chunked object
    counts once, where its manifest is, however many chunks it has."""
    return {"objects": 0 if chunk_of(meta.key) is not None else sign, "bytes_stored": sign * meta.size}


class LiveHits:
    """When a fast-path hit was last answered. Such a hit passes no middleware,
    yet it is live traffic the prefetch pacing (cachenode/front/pacing.py) must
    see: `Counts` marks it here and the pacing reads it, so the count of a hit
    never calls up into the front."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = float("-inf")

    def seen(self) -> None:
        self.last = self.clock()


class StoreSizes(NamedTuple):
    """What the store's gauges show. Handed in by whoever just changed the
    store (`Store.sizes()`): the store is a room above this one, so Counts
    is told its sizes rather than asking for them."""
    used_bytes: int
    objects: int
    capacity: int | None


class Counts:
    def __init__(self, *, metrics: Metrics, index: Index | None,
                 from_peer: Callable[[Any], bool]) -> None:
        self.metrics = metrics
        self.index = index
        self._from_peer = from_peer  # is this aiohttp request a peer's (cachenode/peers/auth.py)?
        self._capacity: int | None | object = _UNSET  # the capacity gauge's last value: set again only when it changes
        self._sizes: StoreSizes | None = None  # the store's last sizes, not yet in its gauges
        metrics.registry.before_collect.append(self._settle_sizes)
        self.live = LiveHits()  # marked by each fast hit; the pacing reads it (cachenode/front/pacing.py)
        m = metrics
        self._counters = (("hits", m.hits), ("misses", m.misses), ("bytes_served", m.bytes_served),
                          ("bytes_from_origin", m.bytes_from_origin), ("failed_fills", m.fill_failures),
                          ("evictions", m.evictions))

    def count(self, host: str, *, request: Any = None, metrics: bool = True, **deltas: int) -> None:
        """Count for Prometheus (what this node did, unless `metrics` is False:
        already counted there) and for the index (`request`: the client
        request the deltas belong to, when there is one)."""
        if metrics:
            for name, counter in self._counters:
                if deltas.get(name):
                    counter.inc(deltas[name])
        if self.index is not None:
            if request is not None and self._from_peer(request):
                deltas = {k: v for k, v in deltas.items() if k not in _REQUEST_FIELDS}
            if deltas:
                self.index.count(host, **deltas)

    def plain_hit(self, host: str, key: str, sent: int, first_byte: float | None, *, hot: bool) -> None:
        """A plain hit the fast path served (a client's, never a peer's):
        what `count(hits=1, bytes_served=sent)`, `accessed()` and the
        request's metrics count, in the fewest steps: this runs for every
        small hit, at thousands a second."""
        self.live.seen()
        self.metrics.plain_hit(sent, first_byte, hot=hot)
        if self.index is not None:
            self.index.count(host, hits=1, bytes_served=sent)
            self.index.object_accessed(key)

    def plain_miss(self, host: str, sent: int, first_byte: float | None) -> None:
        """A plain miss the fast path answered (a client's, never a peer's):
        what `count(misses=1, bytes_served=sent)` and the request's metrics
        count, in plain ints until a scrape (`Metrics.plain_miss`), as `plain_hit`;
        live traffic for the prefetch pacing, as a hit is (a follower's lead's
        miss passes no pacing of its own: cachenode/workers/lead_desk.py)."""
        self.live.seen()
        self.metrics.plain_miss(sent, first_byte)
        if self.index is not None:
            self.index.count(host, misses=1, bytes_served=sent)

    def accessed(self, key: str) -> None:
        """A stored object answered a request (the index's last-access time)."""
        if self.index is not None:
            self.index.object_accessed(key)

    def stored(self, meta: Meta, sizes: StoreSizes) -> None:
        """A fill committed `meta` to the store, now of `sizes`. Its deltas are
        the index's alone (no Prometheus counter counts objects or bytes stored:
        the gauges do), so a node without an index counts only its sizes: this
        runs for every fill."""
        self.store_sizes(sizes)
        if self.index is None:
            return
        self.count(meta.host, **stored_counts(meta, +1))
        if not meta.hot:  # a hot copy is no holder the index names
            # A chunked object's manifest is indexed with the object's length; its chunks each with their own.
            self.index.object_stored(meta.key, host=meta.host, size=meta.body_size)

    def gone(self, meta: Meta, sizes: StoreSizes, **extra: int) -> None:
        """An object left the store (evicted, invalidated, replaced, lost), now of `sizes`."""
        if extra.get("evictions"):
            self.metrics.evicted_age.observe(max(0.0, time.time() - meta.stored_at))
        self.count(meta.host, **stored_counts(meta, -1), **extra)
        if self.index is not None and not meta.hot:
            self.index.object_removed(meta.key, host=meta.host, size=meta.size)
        self.store_sizes(sizes)

    def store_sizes(self, sizes: StoreSizes) -> None:
        """The store's gauges, set when the registry is next read (`_settle_sizes`): a fill changes them
        thousands of times a second, a scrape reads them every few seconds."""
        self._sizes = sizes
        if sizes.capacity != self._capacity:  # it changes only on a reload: one gauge set the less per fill
            self._capacity = sizes.capacity
            self.metrics.set_capacity(sizes.capacity)

    def _settle_sizes(self) -> None:
        sizes, self._sizes = self._sizes, None
        if sizes is not None:
            self.metrics.stored_bytes.set(sizes.used_bytes)
            self.metrics.stored_objects.set(sizes.objects)
