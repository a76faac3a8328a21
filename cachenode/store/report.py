"""The store's own figures, for /metrics and for `nezha stats`: evictions by
reason, bytes by kind of copy, the hit ratio and the working set of the last
hour (cachenode/store/index.py, cachenode/store/census.py).

Read when asked (a scrape, a stats flush), never counted on the read path:
the index keeps plain ints, and this turns them into metric families and
into the fields of the node's stats hash in Redis (docs/redis-schema.md).
"""

from __future__ import annotations

import math
from typing import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from cachenode.store.index import Index

_EVICTIONS = ("nezha_evictions_by_reason", "Objects that left the store, by reason: capacity (room for a newcomer), "
              "extra_copy (a replica or hot copy given up first), refused (a newcomer the policy did not keep), "
              "expired, replaced (a newer response of the same key)")
_BY_COPY = ("nezha_stored_bytes_by_copy", "Bytes stored, by kind of copy: only (this node is the key's first "
            "owner), extra (a replica of a key another node owns first), hot (a hot copy)")
_HIT_RATIO = ("nezha_hit_ratio_last_hour", "Hits over reads of the store in the last hour (NaN before any read)")
_LOADED = ("nezha_store_loaded_ratio", "How far the start-up scan of the store got: folders scanned / folders "
           "(1 once the index holds every stored object; the node serves meanwhile)")
_WORKING_SET = ("nezha_working_set_bytes", "Bytes of the distinct objects read in the last hour: what this node's "
                "share of the tier would need to hold them all (an estimate)")


class StoreReport:
    """A Prometheus collector over one store's index; `fields()` for the stats hash."""

    def __init__(self, index: Index) -> None:
        self._index = index

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(*_EVICTIONS, labels=["reason"])
        yield GaugeMetricFamily(*_BY_COPY, labels=["copy"])
        yield GaugeMetricFamily(*_HIT_RATIO)
        yield GaugeMetricFamily(*_WORKING_SET)
        yield GaugeMetricFamily(*_LOADED)

    def collect(self) -> Iterator[Metric]:
        index = self._index
        evictions = CounterMetricFamily(*_EVICTIONS, labels=["reason"])
        for reason, n in index.evictions.items():
            evictions.add_metric([reason], n)
        yield evictions
        by_copy = GaugeMetricFamily(*_BY_COPY, labels=["copy"])
        for kind, n in index.by_kind().items():
            by_copy.add_metric([kind], n)
        yield by_copy
        ratio = index.census.hit_ratio()
        yield GaugeMetricFamily(*_HIT_RATIO, value=math.nan if ratio is None else ratio)
        yield GaugeMetricFamily(*_WORKING_SET, value=index.census.working_set())
        yield GaugeMetricFamily(*_LOADED, value=index.loaded)

    def fields(self) -> dict[str, int | float | str]:
        """The node's stats-hash fields (`nezha stats`): absolute values since the node started."""
        index = self._index
        kinds = index.by_kind()
        fields: dict[str, int | float | str] = {
            "bytes_only_copy": kinds["only"], "bytes_extra_copy": kinds["extra"], "bytes_hot_copy": kinds["hot"],
            **{f"evicted_{reason}": n for reason, n in index.evictions.items()},
            "working_set_bytes": index.census.working_set(), "store_loaded": f"{index.loaded:.4f}"}
        if (ratio := index.census.hit_ratio()) is not None:
            fields["hit_ratio_hour"] = f"{ratio:.4f}"
        return fields
