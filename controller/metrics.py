"""Prometheus metrics of the controller, served on its health listener at /metrics.

On a registry of its own, so that several controllers in one process (the
leader-election tests) never share counters. What happened is counted where
it happens; what is true now (leading, ring size, Redis reachable) is read
from the controller at each scrape, so it cannot go stale. Names follow
Prometheus conventions; docs/metrics.md lists them all, and a test checks
that list against a running `nezha controller`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, disable_created_metrics, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# No `<name>_created` series: in the text format Prometheus scrapes they are
# gauges of their own, one beside every counter and histogram, that no
# query here reads. Process-wide, as the client library offers it.
disable_created_metrics()

if TYPE_CHECKING:
    from controller.run import Controller

# A pass reads the StatefulSet's annotations and writes Redis: milliseconds, seconds when Redis is slow.
RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# Events (controller/events.py) that are also counted: reason -> (counter attribute, label value).
_EVENT_COUNTS = {
    "DrainStarted": ("drains", "started"), "DrainFinished": ("drains", "finished"),
    "DrainFailed": ("drains", "failed"),
    "ScaledUp": ("scale_steps", "up"), "ScaledDown": ("scale_steps", "down"),
    "ScaleClamped": ("scale_steps", "clamped"),
}


class ControllerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.reconciles = Counter("nezha_controller_reconciles", "Reconcile passes, by outcome: ok, failed "
                                  "(Redis or the API server; retried with backoff), deposed (the ring write was "
                                  "fenced off: another replica leads)", ["outcome"], registry=r)
        self.reconcile_duration = Histogram("nezha_controller_reconcile_duration_seconds", "How long one reconcile "
                                            "pass took, leader only", buckets=RECONCILE_BUCKETS, registry=r)
        self.ring_writes = Counter("nezha_controller_ring_writes", "Ring memberships written to Redis (each a new "
                                   "epoch)", registry=r)
        self.drains = Counter("nezha_controller_drains", "Nodes a scale-down took out of the ring, by how their "
                              "hand-off went: started, finished, failed", ["outcome"], registry=r)
        self.scale_steps = Counter("nezha_controller_scale_steps", "Replica changes the controller wrote: up, "
                                   "down (autoscaler steps), clamped (a kubectl scale outside the bounds)",
                                   ["direction"], registry=r)
        self.prefetches = Counter("nezha_controller_prefetch_urls", "URLs of Jobs' nezha.io/prefetch, by "
                                  "outcome: fetched, failed, refused (malformed)", ["outcome"], registry=r)
        self.annotation_errors = Counter("nezha_controller_annotation_errors", "Invalid nezha.io/* annotations "
                                         "found (each counted once, when first seen)", registry=r)
        self.events_counted = {reason: getattr(self, attr).labels(value)
                               for reason, (attr, value) in _EVENT_COUNTS.items()}
        # Every known label value is exported at 0 from the start: an alert's increase() over a
        # series that appears with its first count would miss that count (the first failed drain).
        for outcome in ("ok", "failed", "deposed"):
            self.reconciles.labels(outcome)
        for outcome in ("fetched", "failed", "refused"):
            self.prefetches.labels(outcome)

    def watch(self, controller: "Controller") -> None:
        """Gauges read from `controller` at each scrape."""
        r = self.registry
        Gauge("nezha_controller_leader", "1 on the replica that holds the Lease and acts, 0 on a standby",
              registry=r).set_function(lambda: 1.0 if controller.leading else 0.0)

        def members() -> float:
            held = controller.index.membership
            return math.nan if held is None else float(len(held.nodes))

        def epoch() -> float:
            held = controller.index.membership
            return math.nan if held is None else float(held.epoch)

        Gauge("nezha_controller_ring_members", "Nodes in the ring as Redis holds it (NaN before the first read)",
              registry=r).set_function(members)
        Gauge("nezha_controller_ring_epoch", "The ring's epoch as Redis holds it: it rises with every write",
              registry=r).set_function(epoch)
        Gauge("nezha_controller_annotation_problems", "nezha.io/* annotations invalid now (the last valid value "
              "stays in force)", registry=r).set_function(lambda: float(len(controller.problems)))
        fills = Gauge("nezha_controller_prefetch_fills", "Prefetch fills now, by state: in_flight (asked of a "
                      "node, until it stores the object; at most twice --prefetch-fills: the node runs --prefetch-fills of "
                      "them at once, the rest wait there), queued (objects of the workloads followed that wait to "
                      "be asked)", ["state"], registry=r)
        fills.labels("in_flight").set_function(lambda: float(controller.prefetcher.in_flight))
        fills.labels("queued").set_function(lambda: float(controller.prefetcher.queued()))
        Gauge("nezha_index_up", "1 while the shared index (Redis) answers, 0 while it fails",
              registry=r).set_function(lambda: 1.0 if controller.index.conn.state == "ok" else 0.0)

    def event(self, reason: str) -> None:
        """An Event the controller records (controller/events.py); some are counted."""
        counter = self.events_counted.get(reason)
        if counter is not None:
            counter.inc()
        elif reason == "InvalidAnnotation":
            self.annotation_errors.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
