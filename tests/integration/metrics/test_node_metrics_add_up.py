"""A real node's new metrics agree with its older counters after the load of components.py.

One node, no peers: every body byte went to a client, so the bytes by source
add up to all bytes served; every hit and miss has its time to first byte
(fast-path hits too); every fill its duration; every eviction its age.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.asyncio(loop_scope="package")


def values(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def test_bytes_by_source_add_up_to_bytes_served_on_a_node_without_peers(exported):
    v = values(exported["cache"])
    by_source = {src: v[("nezha_bytes_served_by_source_total", (("source", src),))]
                 for src in ("disk", "fill", "peer", "origin")}
    assert by_source["peer"] == 0
    assert by_source["disk"] > 0 and by_source["fill"] > 0 and by_source["origin"] > 0
    assert sum(by_source.values()) == v[("nezha_bytes_served_total", ())]


async def test_every_hit_and_miss_has_a_time_to_first_byte_and_every_fill_a_duration(exported):
    v = values(exported["cache"])
    requests = lambda cache: v[("nezha_requests_total", (("cache", cache),))]  # noqa: E731
    first_byte = lambda cache: v[("nezha_time_to_first_byte_seconds_count", (("cache", cache),))]  # noqa: E731
    assert requests("hit") > 0 and first_byte("hit") == requests("hit")
    assert first_byte("miss") == requests("miss") + requests("miss-joined") > 0
    assert first_byte("pass") == requests("bypass") == 1
    stored = v[("nezha_fill_duration_seconds_count", (("outcome", "stored"), ("source", "origin")))]
    assert stored == 4  # four objects filled from the origin
    assert v[("nezha_evicted_age_seconds_count", ())] == v[("nezha_evictions_total", ())] == 1
    assert v[("nezha_capacity_bytes", ())] == 3 * 64 * 1024
    assert v[("nezha_index_up", ())] == 1
