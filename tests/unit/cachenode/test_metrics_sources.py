"""Which source a client's bytes are counted under, by the answer's X-Nezha-Cache value."""

from __future__ import annotations

import pytest

from cachenode.metrics import Metrics, source_of
from nezha.wire import CacheOutcome, relayed


@pytest.mark.parametrize("cache,source", [
    (CacheOutcome.HIT, "disk"), (CacheOutcome.STALE, "disk"), (CacheOutcome.REVALIDATED, "disk"),
    (CacheOutcome.AUTHORIZED, "disk"), ("hit-aborted", "disk"),
    (CacheOutcome.MISS, "fill"), (CacheOutcome.MISS_JOINED, "fill"), ("miss-aborted", "fill"),
    (relayed(CacheOutcome.HIT), "peer"), (relayed(CacheOutcome.MISS), "peer"), ("peer-unknown", "peer"),
    (CacheOutcome.PASS, "origin"), (CacheOutcome.BYPASS, "origin"), (CacheOutcome.DENIED, "origin"),
    (CacheOutcome.ERROR, None), (CacheOutcome.REFUSED, None), ("admin", None), (None, None),
])
def test_each_answer_counts_its_bytes_under_where_they_came_from(cache, source):
    assert source_of(cache) == source


def test_an_answer_the_node_made_itself_counts_no_bytes_and_no_first_byte():
    m = Metrics()
    m.served(CacheOutcome.ERROR, 100, first_byte=0.5)
    text = m.render().decode()
    assert 'nezha_bytes_served_by_source_total{source="disk"} 0.0' in text
    assert 'nezha_time_to_first_byte_seconds_count{cache="hit"} 0.0' in text
    m.served(relayed(CacheOutcome.HIT), 100, first_byte=0.5)
    text = m.render().decode()
    assert 'nezha_bytes_served_by_source_total{source="peer"} 100.0' in text
    assert 'nezha_time_to_first_byte_seconds_count{cache="peer"} 1.0' in text


def test_every_parent_fallback_reason_is_exported_from_the_start():
    from nezha.wire import ParentFallback

    text = Metrics().render().decode()
    assert all(f'nezha_parent_fallbacks_total{{reason="{f.value}"}} 0.0' in text for f in ParentFallback)
