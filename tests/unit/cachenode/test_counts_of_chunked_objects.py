"""What a chunked object counts in the index's statistics (docs/redis-schema.md, "Statistics"): one object,
where its manifest is, however many chunks; each chunk's bytes where the chunk lies; a client's read one
hit, miss or relayed answer, never one per chunk."""

from __future__ import annotations

import pytest

from cachenode.counts import Counts, StoreSizes, answer_counts, stored_counts
from cachenode.metrics import Metrics
from cachenode.store.objects import Meta
from nezha.chunks import chunk_key

KEY = "http://data.example/big.bin"
MiB = 1 << 20


def meta(key: str, *, size: int, chunk_size: int = 0, length: int = 0) -> Meta:
    return Meta(key=key, url=key, host="data.example", size=size, headers=(), stored_at=0.0, expires_at=60.0,
                chunk_size=chunk_size, length=length)


MANIFEST = meta(KEY, size=0, chunk_size=4 * MiB, length=10 * MiB)
CHUNK = meta(chunk_key(KEY, 2, 4 * MiB), size=2 * MiB, length=10 * MiB)
WHOLE = meta("http://data.example/small.bin", size=3 * MiB)


@pytest.mark.parametrize(("label", "counts"), [
    ("hit", {"hits": 1}), ("hot-hit", {"hits": 1}), ("stale", {"hits": 1}), ("revalidated", {"hits": 1}),
    ("miss", {"misses": 1}), ("miss-joined", {"misses": 1}),
    ("peer-hit", {}), ("peer-miss", {}), ("peer-revalidated", {}),
])
def test_a_stored_answer_counts_a_hit_a_miss_when_a_fill_just_stored_it_and_nothing_when_relayed(label, counts):
    assert answer_counts(label) == counts


@pytest.mark.parametrize(("stored", "sign", "deltas"), [
    (WHOLE, +1, {"objects": 1, "bytes_stored": 3 * MiB}),
    (WHOLE, -1, {"objects": -1, "bytes_stored": -3 * MiB}),
    (MANIFEST, +1, {"objects": 1, "bytes_stored": 0}),
    (MANIFEST, -1, {"objects": -1, "bytes_stored": 0}),
    (CHUNK, +1, {"objects": 0, "bytes_stored": 2 * MiB}),
    (CHUNK, -1, {"objects": 0, "bytes_stored": -2 * MiB}),
])
def test_a_chunk_weighs_its_bytes_but_only_the_manifest_is_an_object(stored, sign, deltas):
    assert stored_counts(stored, sign) == deltas


SIZES = StoreSizes(used_bytes=0, objects=0, capacity=None)


class _Index:
    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.held: set[str] = set()

    def count(self, host: str, **deltas: int) -> None:
        for name, value in deltas.items():
            self.totals[name] = self.totals.get(name, 0) + value

    def object_stored(self, key: str, **_) -> None:
        self.held.add(key)

    def object_removed(self, key: str, **_) -> None:
        self.held.discard(key)


def test_an_object_in_three_chunks_is_one_object_of_its_bytes_and_each_chunk_is_indexed_as_held():
    index = _Index()
    counts = Counts(metrics=Metrics(), index=index, from_peer=lambda request: False)
    chunks = [meta(chunk_key(KEY, i, 4 * MiB), size=n, length=10 * MiB) for i, n in enumerate((4 * MiB, 4 * MiB, 2 * MiB))]
    counts.stored(MANIFEST, SIZES)
    for c in chunks:
        counts.stored(c, SIZES)
    assert index.totals == {"objects": 1, "bytes_stored": 10 * MiB}
    assert index.held == {KEY, *(c.key for c in chunks)}
    counts.gone(chunks[2], SIZES, evictions=1)
    assert index.totals == {"objects": 1, "bytes_stored": 8 * MiB, "evictions": 1}
    for c in chunks[:2]:
        counts.gone(c, SIZES)
    counts.gone(MANIFEST, SIZES)
    assert index.totals == {"objects": 0, "bytes_stored": 0, "evictions": 1}
    assert index.held == set()


def test_chunk_bytes_sent_to_a_peer_are_bytes_this_node_served_but_no_client_bytes_in_the_index():
    index, metrics = _Index(), Metrics()
    counts = Counts(metrics=metrics, index=index, from_peer=lambda request: request == "peer")
    counts.count("data.example", request="peer", bytes_served=MiB)
    assert metrics.registry.get_sample_value("nezha_bytes_served_total") == MiB
    assert index.totals == {}
