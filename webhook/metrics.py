"""Prometheus metrics of the webhook, served on `--metrics-listen` (plain HTTP) at /metrics.

On a registry of its own, so that several webhooks in one process (tests)
never share counters. docs/metrics.md lists them, and a test checks that
list against a running `nezha webhook`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, disable_created_metrics, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# No `<name>_created` series: in the text format Prometheus scrapes they are
# gauges of their own, one beside every counter and histogram, that no
# query here reads. Process-wide, as the client library offers it.
disable_created_metrics()

from webhook.review import Decision

# A review is parsed and patched in well under a millisecond; the API server gives up at timeoutSeconds (5 s).
ADMISSION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
OUTCOMES = ("patched", "unmatched", "failed_open", "invalid", "error")


def outcome_of(decision: Decision) -> str:
    """patched (aliases added), unmatched (no rule picks it: nothing to do), failed_open (a rule picks it
    but it cannot be patched: allowed unchanged, with a warning)."""
    if decision.ops:
        return "patched"
    return "failed_open" if decision.warnings else "unmatched"


class WebhookMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.admissions = Counter(
            "nezha_webhook_admissions", "AdmissionReviews answered at /mutate, by outcome: patched, unmatched "
            "(no rule picks the object), failed_open (allowed unchanged with a warning: it could not be "
            "patched), invalid (a 400: not an AdmissionReview), error (a 500)", ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.admissions.labels(outcome)  # every outcome is exported from the start, at 0
        self.duration = Histogram("nezha_webhook_admission_duration_seconds", "From a review's request to its "
                                  "answer, body read included", buckets=ADMISSION_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
