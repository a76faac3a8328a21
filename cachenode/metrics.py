"""Prometheus metrics of one node, on a registry of its own so that several
nodes in one process (tests) never share counters.

Names follow Prometheus conventions: counters end in `_total`, sizes are
bytes and durations seconds (`_bytes`, `_seconds`). docs/metrics.md lists
every one, and a test checks that list against what a running node exports.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, disable_created_metrics, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# No `<name>_created` series: in the text format Prometheus scrapes they are
# gauges of their own, one beside every counter and histogram, that no
# query here reads. Process-wide, as the client library offers it.
disable_created_metrics()

from nezha.wire import CacheOutcome, ParentFallback

# Where the body bytes a client got came from, by its X-Nezha-Cache value
# (nezha/wire.py; a relay's is the owner's behind `peer-`). An aborted
# answer (`hit-aborted`) counts under its own source.
_SOURCE = {"hit": "disk", "hot-hit": "disk", "stale": "disk", "revalidated": "disk", "authorized": "disk",
           "miss": "fill", "miss-joined": "fill",
           "pass": "origin", "bypass": "origin", "denied": "origin"}
SOURCES = ("disk", "fill", "peer", "origin")
# Time to first byte is kept for these kinds of answer, by the same values.
_FIRST_BYTE = {"hit": "hit", "hot-hit": "hit", "stale": "hit", "revalidated": "hit", "authorized": "hit",
               "miss": "miss", "miss-joined": "miss", "pass": "pass", "bypass": "pass", "denied": "pass"}

# A hit's head leaves in microseconds to milliseconds; a miss waits for the origin (seconds).
FIRST_BYTE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A fill lasts from milliseconds (a small object) to many minutes (tens of GB).
FILL_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
# How long an evicted object had been stored: under an hour means the working set does not fit.
EVICTED_AGE_BUCKETS = (10, 30, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400, 30 * 86400)


def source_of(cache: str | None) -> str | None:
    """The source of the bytes of an answer labelled `cache`; None for the node's own answers."""
    if not cache:
        return None
    cache = cache.removesuffix("-aborted")
    if cache.startswith("peer-"):
        return "peer"
    return _SOURCE.get(cache)


class SettledRegistry(CollectorRegistry):
    """A registry that runs `before_collect` first at every read (a scrape, a
    test's get_sample_value): the hot path keeps plain-int tallies, and this
    is where they become counter values, so every read sees every request
    exactly once."""

    def __init__(self) -> None:
        super().__init__()
        self.before_collect: list[Callable[[], None]] = []

    def collect(self) -> Iterator[Metric]:
        for settle in self.before_collect:
            settle()
        yield from super().collect()


class PlainHistogram:
    """A histogram by label values (`kinds`, each a tuple of them), as plain ints.

    Observed once per request (`nezha_time_to_first_byte_seconds`, plain hits
    included) or per fill (`nezha_fill_duration_seconds`), read only at a
    scrape. prometheus-client's Histogram takes a lock and walks its bounds
    for each observation (several microseconds, in a hit that costs tens);
    here an observation is a bisect and two additions. Only the event loop's
    thread observes. Exported like the library's (cumulative `le` buckets,
    `_count`, `_sum`), every kind from zero."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...], bounds: tuple[float, ...],
                 kinds: tuple[tuple[str, ...], ...]) -> None:
        self.name, self.documentation, self._labels = name, documentation, labels
        self._bounds = bounds
        self._les = [floatToGoString(b) for b in bounds] + ["+Inf"]
        self._counts = {kind: [0] * (len(bounds) + 1) for kind in kinds}
        self._sums = dict.fromkeys(kinds, 0.0)

    def observe(self, kind: tuple[str, ...], seconds: float) -> None:
        self._counts[kind][bisect_left(self._bounds, seconds)] += 1  # le is inclusive: bounds[i] >= seconds
        self._sums[kind] += seconds

    def labels(self, **values: str) -> PlainSeries:
        """The series of these label values, to observe as prometheus-client's child is observed; made
        at its first use, as that library makes it, when it is none of `kinds`."""
        if values.keys() != set(self._labels):
            raise ValueError(f"{self.name} takes the labels {self._labels}, not {tuple(values)}")
        kind = tuple(str(values[label]) for label in self._labels)
        if kind not in self._counts:
            self._counts[kind] = [0] * (len(self._bounds) + 1)
            self._sums[kind] = 0.0
        return PlainSeries(self, kind)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=list(self._labels))

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self._labels))
        for kind, counts in self._counts.items():
            family.add_metric(list(kind), list(zip(self._les, accumulate(counts))), self._sums[kind])
        yield family


class PlainSeries:
    """One series of a `PlainHistogram`."""

    __slots__ = ("_histogram", "_kind")

    def __init__(self, histogram: PlainHistogram, kind: tuple[str, ...]) -> None:
        self._histogram, self._kind = histogram, kind

    def observe(self, seconds: float) -> None:
        self._histogram.observe(self._kind, seconds)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = SettledRegistry()
        r = self.registry
        self._add_clients(r)
        self._add_upstream(r)
        self.worker_handovers = Counter("nezha_worker_handovers", "Client connections a follower worker "
                                        "(--workers) handed to the primary, which serves what the followers' fast "
                                        "path does not: misses, ranges, peers, probes", registry=r)
        self.worker_givebacks = Counter("nezha_worker_givebacks", "Client connections a follower handed to the "
                                        "primary that went back to it once they read hits again", registry=r)
        self.worker_leads = Counter("nezha_worker_leads", "Followers' asks to lead a small cold fill themselves, "
                                    "by how each ended", ("outcome",), registry=r)
        for outcome in ("denied", "stored", "declined", "refused", "lost"):
            self.worker_leads.labels(outcome)
        self.small_gets = Counter("nezha_small_gets", "Cold small fills the fast path asked on the node's own "
                                  "connections, by outcome", ("outcome",), registry=r)
        for outcome in ("stored", "fallback"):
            self.small_gets.labels(outcome)
        # A fill stored at once (cachenode/fill/at_once.py): its origin bytes, and the small gets' outcomes
        # (cachenode/front/fast_misses.py), in plain ints until the registry is read, as plain hits'.
        self._origin_bytes = 0
        self._small_gets = [0, 0]  # fallback, stored
        self._small_gets_counters = (self.small_gets.labels("fallback"), self.small_gets.labels("stored"))
        r.before_collect.append(self._settle_fills)
        self._add_fills(r)
        self.first_byte = PlainHistogram(
            "nezha_time_to_first_byte_seconds", "From a request read to its response head sent, by answer: hit "
            "(from disk), miss (a fill), peer (relayed), pass (the origin's, passed through)", ("cache",),
            FIRST_BYTE_BUCKETS, (("hit",), ("miss",), ("peer",), ("pass",)))
        r.register(self.first_byte)
        # Plain hits (cachenode/front/fastpath.py) since the last read: plain
        # ints, added to the counters above when the registry is read.
        self._hits = self._hot_hits = self._hit_bytes = 0
        self._hit_requests = self.requests.labels(cache=CacheOutcome.HIT)
        self._hot_hit_requests = self.requests.labels(cache=CacheOutcome.HOT_HIT)
        r.before_collect.append(self._settle_hits)
        # The same for plain misses the fast path answered (cachenode/front/fast_misses.py).
        self._misses = self._miss_bytes = 0
        self._miss_requests = self.requests.labels(cache=CacheOutcome.MISS)
        r.before_collect.append(self._settle_misses)
        self._add_store(r)
        self._add_connections(r)

    def _add_clients(self, r: SettledRegistry) -> None:
        """What clients were answered: requests by outcome, hits, misses, and
        body bytes by where they came from."""
        self.requests = Counter("nezha_requests", "Requests answered, by cache outcome", ["cache"], registry=r)
        for value in (*CacheOutcome, "none"):
            # Exported at 0 from the start: an alert's increase() or rate() over a series that
            # appears with its first count would miss that count.
            self.requests.labels(cache=value)
        self.hits = Counter("nezha_cache_hits", "Requests served from this node's disk", registry=r)
        self.misses = Counter("nezha_cache_misses", "Requests served from a fill in progress (the origin was "
                              "needed)", registry=r)
        self.bytes_served = Counter("nezha_bytes_served", "Body bytes sent to clients: stored objects, fills "
                                    "in progress and pass-through (bypass, unstorable, origin errors)", registry=r)
        self.bytes_by_source = Counter(
            "nezha_bytes_served_by_source", "Body bytes sent to clients (not to peers: a sum over nodes counts "
            "each byte once), by where they came from: disk (a stored object), fill (a fill in progress), "
            "peer (relayed from the key's owner), origin (passed through, nothing stored)", ["source"], registry=r)
        self._by_source = {s: self.bytes_by_source.labels(source=s) for s in SOURCES}

    def _add_fills(self, r: SettledRegistry) -> None:
        """Fills: in progress, failed, how long they took, and bytes that are
        not what a digest or the node's own checksum says."""
        self.fills_in_flight = Gauge("nezha_fills_in_flight", "Origin fills in progress", registry=r)
        self.fill_failures = Counter("nezha_fill_failures", "Fills that failed and stored nothing", registry=r)
        # Issue 37: a source's bytes that are not what its published digest says.
        self.digest_mismatches = Counter("nezha_digest_mismatches", "Fills whose bytes did not match the digest "
                                         "their source published (nothing stored, clients cut), by origin host",
                                         ["origin"], registry=r)
        # Issue 37 items 2-3: stored or copied bytes that are not the ones the node's own checksum names.
        self.corrupt_objects = Counter("nezha_corrupt_objects", "Objects whose bytes did not match the node's own "
                                       "checksum, by what found them: copy (a peer's copy, not committed), read "
                                       "(--verify-reads), scrub; each removed and fetched again",
                                       ["found_by"], registry=r)
        for found_by in ("copy", "read", "scrub"):
            self.corrupt_objects.labels(found_by=found_by)
        self.fill_duration = PlainHistogram(
            "nezha_fill_duration_seconds", "How long a fill took, from the source's answer to its end, by source "
            "(origin, peer) and outcome (stored; failed; not_stored: streamed whole, but not kept)",
            ("source", "outcome"), FILL_BUCKETS,
            tuple((source, outcome) for source in ("origin", "peer") for outcome in ("stored", "failed", "not_stored")))
        r.register(self.fill_duration)

    def _add_store(self, r: SettledRegistry) -> None:
        """The store: what it holds, its capacity, and what eviction took."""
        self.evictions = Counter("nezha_evictions", "Objects evicted to stay under capacity", registry=r)
        self.evicted_age = Histogram(
            "nezha_evicted_age_seconds", "How long an evicted object had been stored (since its fill or last "
            "revalidation)", buckets=EVICTED_AGE_BUCKETS, registry=r)
        self.stored_bytes = Gauge("nezha_stored_bytes", "Bytes of complete objects on disk", registry=r)
        self.stored_objects = Gauge("nezha_stored_objects", "Complete objects on disk", registry=r)
        self.capacity_bytes = Gauge("nezha_capacity_bytes", "The store's capacity (cache.capacity); +Inf when "
                                    "unbounded", registry=r)

    def _add_connections(self, r: SettledRegistry) -> None:
        """Client connections: the TLS port's outcomes, and those the connection cap closed or refused."""
        self.tls_connections = Counter("nezha_tls_connections", "Connections to the TLS port, by outcome: "
                                       "terminated (served here with a minted certificate), relayed to the real "
                                       "host, refused (a name that is not an origin, no name, not TLS), failed "
                                       "(the handshake failed, or the real host could not be reached)",
                                       ["outcome"], registry=r)
        for outcome in ("terminated", "relayed", "refused", "failed"):
            self.tls_connections.labels(outcome)
        self.connections_reclaimed = Counter("nezha_connections_reclaimed", "Idle or trickling client "
                                             "connections closed at the connection cap", registry=r)
        self.connections_refused = Counter("nezha_connections_refused", "Clients answered 503 at the connection "
                                           "cap, every connection being busy", registry=r)

    def _add_upstream(self, r: SettledRegistry) -> None:
        """What came from upstream: origins' bytes (and those thrown away), the
        parent tier's, and the requests meant for it that went to the origin."""
        self.bytes_from_origin = Counter("nezha_bytes_from_origin", "Body bytes received from origins", registry=r)
        self.origin_bytes_discarded = Counter("nezha_origin_bytes_discarded", "Body bytes origins delivered that "
                                              "were thrown away: the first answer of a parallel fill, closed "
                                              "unread, holds what the origin sent before its headers were read",
                                              registry=r)
        self.bytes_from_parent = Counter("nezha_bytes_from_parent", "Body bytes of fills received from this "
                                         "node's parent tier (--parent), not counted as from origins", registry=r)
        self.parent_fallbacks = Counter("nezha_parent_fallbacks", "Requests meant for the parent tier that went "
                                        "to the origin, by reason: unreachable, timeout, 5xx (the parent's own), "
                                        "down (it failed moments ago, not tried), broken (its answer broke off mid-body; the "
                                        "origin sent the rest)", ["reason"], registry=r)
        for reason in ParentFallback:
            self.parent_fallbacks.labels(reason=reason.value)

    def watch_index(self, healthy: Callable[[], bool]) -> None:
        """`nezha_index_up`, read at each scrape: only a node with a shared index has one."""
        Gauge("nezha_index_up", "1 while the shared index (Redis) answers every part of this node, 0 while one "
              "fails", registry=self.registry).set_function(lambda: 1.0 if healthy() else 0.0)

    def set_capacity(self, capacity: int | None) -> None:
        self.capacity_bytes.set(math.inf if capacity is None else capacity)

    def served(self, cache: str | None, nbytes: int, *, first_byte: float | None) -> None:
        """One client request's answer (not a peer's): its bytes by source, its time to first byte."""
        source = source_of(cache)
        if source is None:
            return
        if nbytes:
            self._by_source[source].inc(nbytes)
        if first_byte is not None:
            kind = "peer" if source == "peer" else _FIRST_BYTE.get((cache or "").removesuffix("-aborted"))
            if kind is not None:
                self.first_byte.observe((kind,), first_byte)

    def plain_hit(self, nbytes: int, first_byte: float | None, *, hot: bool) -> None:
        """One plain hit the fast path served: what `requests`, `hits`,
        `bytes_served`, `served()` and the first-byte histogram count for a
        hit, in plain ints (a 100 KiB hit costs tens of microseconds; five
        prometheus-client updates were several of them)."""
        if hot:
            self._hot_hits += 1
        else:
            self._hits += 1
        self._hit_bytes += nbytes
        if first_byte is not None:
            self.first_byte.observe(("hit",), first_byte)

    def plain_miss(self, nbytes: int, first_byte: float | None) -> None:
        """One plain miss the fast path answered from a fill stored at once:
        what `requests`, `misses`, `bytes_served`, `served()` and the
        first-byte histogram count for it, in plain ints as `plain_hit`'s."""
        self._misses += 1
        self._miss_bytes += nbytes
        if first_byte is not None:
            self.first_byte.observe(("miss",), first_byte)

    def from_origin(self, nbytes: int) -> None:
        """Body bytes a fill stored at once got from the origin (`bytes_from_origin`)."""
        self._origin_bytes += nbytes

    def small_get(self, stored: bool) -> None:
        """A cold small fill asked on the node's own connections: stored, or asked again the usual way."""
        self._small_gets[stored] += 1

    def _settle_fills(self) -> None:
        nbytes, self._origin_bytes = self._origin_bytes, 0
        if nbytes:
            self.bytes_from_origin.inc(nbytes)
        for stored, counter in enumerate(self._small_gets_counters):
            if self._small_gets[stored]:
                counter.inc(self._small_gets[stored])
                self._small_gets[stored] = 0

    def _settle_misses(self) -> None:
        misses, nbytes = self._misses, self._miss_bytes
        self._misses = self._miss_bytes = 0
        if misses:
            self._miss_requests.inc(misses)
            self.misses.inc(misses)
        if nbytes:
            self.bytes_served.inc(nbytes)
            self._by_source["fill"].inc(nbytes)

    def _settle_hits(self) -> None:
        hits, hot, nbytes = self._hits, self._hot_hits, self._hit_bytes
        self._hits = self._hot_hits = self._hit_bytes = 0
        if hits:
            self._hit_requests.inc(hits)
        if hot:
            self._hot_hit_requests.inc(hot)
        if hits or hot:
            self.hits.inc(hits + hot)
        if nbytes:
            self.bytes_served.inc(nbytes)
            self._by_source["disk"].inc(nbytes)

    def render(self) -> bytes:
        return generate_latest(self.registry)
