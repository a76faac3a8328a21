"""Prometheus metrics of one node, on a registry of its own so that several
nodes in one process (tests) never share counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("nezha_requests", "Requests answered, by cache outcome", ["cache"], registry=r)
        self.hits = Counter("nezha_cache_hits", "Requests served from this node's disk", registry=r)
        self.misses = Counter("nezha_cache_misses", "Requests served from a fill in progress (the origin was "
                              "needed)", registry=r)
        self.bytes_served = Counter("nezha_bytes_served", "Body bytes sent to clients: stored objects, fills "
                                    "in progress and pass-through (bypass, unstorable, origin errors)", registry=r)
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
        self.fills_in_flight = Gauge("nezha_fills_in_flight", "Origin fills in progress", registry=r)
        self.fill_failures = Counter("nezha_fill_failures", "Fills that failed and stored nothing", registry=r)
        self.evictions = Counter("nezha_evictions", "Objects evicted to stay under capacity", registry=r)
        self.stored_bytes = Gauge("nezha_stored_bytes", "Bytes of complete objects on disk", registry=r)
        self.stored_objects = Gauge("nezha_stored_objects", "Complete objects on disk", registry=r)
        self.tls_connections = Counter("nezha_tls_connections", "Connections to the TLS port, by outcome: "
                                       "terminated (served here with a minted certificate), relayed to the real "
                                       "host, refused (a name that is not an origin, no name, not TLS), failed "
                                       "(the handshake failed, or the real host could not be reached)",
                                       ["outcome"], registry=r)
        self.connections_reclaimed = Counter("nezha_connections_reclaimed", "Idle or trickling client "
                                             "connections closed at the connection cap", registry=r)
        self.connections_refused = Counter("nezha_connections_refused", "Clients answered 503 at the connection "
                                           "cap, every connection being busy", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
