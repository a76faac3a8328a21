"""Plain hits are tallied in plain ints and settled into the counters at every read: exact, and never twice."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from cachenode.metrics import FILL_BUCKETS, FIRST_BYTE_BUCKETS, Metrics, PlainHistogram


def _value(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_plain_hits_are_counted_exactly_once_whichever_way_the_registry_is_read():
    m = Metrics()
    for i in range(1000):
        m.plain_hit(100, 0.0001 * (i % 7), hot=i % 10 == 0)
    m.plain_hit(0, None, hot=False)  # a HEAD that left no time to first byte
    text = m.render().decode()
    assert 'nezha_requests_total{cache="hit"} 901.0' in text
    assert 'nezha_requests_total{cache="hot-hit"} 100.0' in text
    # Read again, the other way: the tally was settled once, not added again.
    assert _value(m, "nezha_cache_hits_total") == 1001
    assert _value(m, "nezha_bytes_served_total") == 100_000
    assert _value(m, "nezha_bytes_served_by_source_total", source="disk") == 100_000
    assert _value(m, "nezha_time_to_first_byte_seconds_count", cache="hit") == 1000
    assert _value(m, "nezha_requests_total", cache="hit") == 901


def test_plain_hits_add_to_what_the_handler_counted_for_the_same_series():
    m = Metrics()
    m.requests.labels(cache="hit").inc()
    m.hits.inc()
    m.bytes_served.inc(7)
    m.served("hit", 7, first_byte=0.002)
    m.plain_hit(5, 0.001, hot=False)
    assert _value(m, "nezha_requests_total", cache="hit") == 2
    assert _value(m, "nezha_cache_hits_total") == 2
    assert _value(m, "nezha_bytes_served_total") == 12
    assert _value(m, "nezha_bytes_served_by_source_total", source="disk") == 12
    assert _value(m, "nezha_time_to_first_byte_seconds_count", cache="hit") == 2
    assert _value(m, "nezha_time_to_first_byte_seconds_sum", cache="hit") == 0.003


@pytest.mark.parametrize("labels, kinds, bounds", [
    (("cache",), (("hit",), ("miss",), ("peer",), ("pass",)), FIRST_BYTE_BUCKETS),
    (("source", "outcome"), (("origin", "stored"), ("origin", "failed"), ("peer", "stored")), FILL_BUCKETS),
])
def test_a_plain_histogram_exports_what_prometheus_clients_histogram_would(labels, kinds, bounds):
    """Same buckets (le inclusive, values on a bound included), counts and sums, line for line, by one
    label (time to first byte) or two (fill duration), observed directly or through a series."""
    ours = PlainHistogram("nezha_some_seconds", "Some seconds", labels, bounds, kinds)
    reg_ours = CollectorRegistry()
    reg_ours.register(ours)
    reg_lib = CollectorRegistry()
    lib = Histogram("nezha_some_seconds", "Some seconds", list(labels), buckets=bounds, registry=reg_lib)
    for kind in kinds:
        lib.labels(*kind)
    values = [0.0, 0.0001, 0.0005, 0.00051, 0.001, 0.3, 2.5, 30, 31, 1e9, *bounds]
    for i, v in enumerate(values):
        kind = kinds[i % 3]
        if i % 2:
            ours.observe(kind, v)
        else:
            ours.labels(**dict(zip(labels, kind))).observe(v)
        lib.labels(*kind).observe(v)

    def lines(reg):
        return sorted(line for line in generate_latest(reg).decode().splitlines()
                      if not line.startswith("#") and "_created" not in line)

    assert lines(reg_ours) == lines(reg_lib)


def test_a_plain_histograms_series_not_declared_is_made_at_its_first_use_as_the_librarys_is():
    ours = PlainHistogram("nezha_some_seconds", "Some seconds", ("source", "outcome"), FILL_BUCKETS,
                          (("origin", "stored"),))
    reg_ours = CollectorRegistry()
    reg_ours.register(ours)
    reg_lib = CollectorRegistry()
    lib = Histogram("nezha_some_seconds", "Some seconds", ["source", "outcome"], buckets=FILL_BUCKETS, registry=reg_lib)
    lib.labels("origin", "stored")
    ours.labels(source="origin", outcome="passed").observe(0.2)
    lib.labels(source="origin", outcome="passed").observe(0.2)
    assert generate_latest(reg_ours) == generate_latest(reg_lib)
    with pytest.raises(ValueError):
        ours.labels(source="origin")
    with pytest.raises(ValueError):
        ours.labels(source="origin", outcome="stored", extra="x")
