"""The store's in-memory index (cachenode/store/index.py): which kind of copy
goes first, why each object left, and what the last hour's reads say."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cachenode.store.census import Census
from cachenode.store.index import Index
from cachenode.store.objects import Meta
from cachenode.store.report import StoreReport
from nezha.keys import object_id


def meta(name: str, size: int = 100, *, extra: bool = False, hot: bool = False) -> Meta:
    key = f"http://h/{name}"
    return Meta(key=key, url=key, host="h", size=size, headers=(), stored_at=0.0, expires_at=60.0,
                extra=extra, hot=hot)


def indexed(clock=lambda: 0.0) -> tuple[Index, list[tuple[str, str]]]:
    gone: list[tuple[str, str]] = []
    index = Index(evicted=lambda m, reason: gone.append((m.key.rsplit("/", 1)[1], reason)),
                  census=Census(clock=clock))
    return index, gone


def commit(index: Index, m: Meta, limit: int) -> bool:
    """As Store.commit does: judged, then counted as a miss and added and room made; False when refused (a miss
    counted too)."""
    admitted = index.admits(m, index.candidate(m), limit)
    index.arrived(m)
    if not admitted:
        return False
    index.add(m)
    index.evict_to(limit, keep=m.slot)
    return True


def test_an_extra_copy_is_given_up_before_the_only_copy_of_another_object():
    index, gone = indexed()
    assert commit(index, meta("replica", extra=True), 300)
    assert commit(index, meta("a"), 300) and commit(index, meta("b"), 300)
    index.lookup("http://h/replica")  # read last: recency does not save an extra copy
    assert commit(index, meta("c"), 300)
    assert gone == [("replica", "extra_copy")]
    assert index.by_kind() == {"only": 300, "extra": 0, "hot": 0}


def test_an_extra_copy_never_displaces_an_only_copy():
    index, gone = indexed()
    for name in "abc":
        assert commit(index, meta(name), 300)
    assert not commit(index, meta("replica", extra=True), 300)
    assert gone == [] and "http://h/replica" not in index.slots
    assert index.evictions["refused"] == 1


def test_hot_copies_go_before_extra_copies():
    index, gone = indexed()
    assert commit(index, meta("replica", extra=True), 300)
    assert commit(index, meta("hot", hot=True), 300)
    assert commit(index, meta("a"), 300)
    assert commit(index, meta("b"), 300)
    assert gone == [("hot", "extra_copy")]


def test_a_reservation_within_the_headroom_evicts_nothing_and_beyond_it_the_victim():
    index, gone = indexed()
    for name in "abc":
        assert commit(index, meta(name), 300)
    index.reserve(30)
    index.evict_to(300)
    assert gone == []
    index.reserve(1)
    index.evict_to(300)
    assert gone == [("a", "capacity")]


def test_each_departure_is_counted_under_its_reason():
    index, _ = indexed()
    index.add(meta("a"))
    index.drop("http://h/a", reason="replaced")
    index.add(meta("b"))
    index.drop("http://h/b", reason="expired")
    index.add(meta("c"))
    index.drop("http://h/c")  # a removal (an invalidation): no eviction
    assert {r: n for r, n in index.evictions.items() if n} == {"replaced": 1, "expired": 1}


def test_the_census_counts_the_hit_ratio_and_the_distinct_bytes_of_the_last_hour():
    now = [0.0]
    index, _ = indexed(clock=lambda: now[0])
    for name in "ab":
        commit(index, meta(name, 1000), 10_000)
    for _ in range(3):
        index.lookup("http://h/a")
    assert index.census.hit_ratio() == 3 / 5
    assert index.census.working_set() == 2000  # a and b, each once however often read
    now[0] = 3700.0  # an hour later, nothing read since
    assert index.census.hit_ratio() is None and index.census.working_set() == 0
    index.lookup("http://h/b")
    assert index.census.working_set() == 1000


def test_the_report_gives_the_stats_fields_an_operator_reads():
    index, _ = indexed()
    commit(index, meta("a"), 300)
    commit(index, meta("r", extra=True), 300)
    index.lookup("http://h/a")
    fields = StoreReport(index).fields()
    assert fields["bytes_only_copy"] == 100 and fields["bytes_extra_copy"] == 100
    assert fields["hit_ratio_hour"] == "0.3333" and fields["working_set_bytes"] == 200
    assert fields["evicted_capacity"] == 0 and "evicted_refused" in fields


def test_a_protected_object_is_passed_over_by_every_eviction():
    """A key the store protects (a workload's pin) is never a victim, of capacity or of a reservation."""
    gone: list[str] = []
    index = Index(evicted=lambda m, reason: gone.append(m.key.rsplit("/", 1)[1]),
                  protected=lambda key: key.endswith("/a"))
    for name in "abc":
        assert commit(index, meta(name), 300)
    index.reserve(200)
    index.evict_to(300)
    assert gone == ["b", "c"] and "http://h/a" in index.slots


def on_disk(name: str, size: int = 100) -> Meta:
    """A meta whose data file name the index can find it by again (`{oid}.{nonce}.obj`)."""
    m = meta(name, size)
    return replace(m, data=f"{object_id(m.key)}.00000000002a.obj")


def test_records_are_read_back_from_disk_and_one_naming_another_slot_is_never_served():
    """A compact row keeps no record: a hit reads it (`records`); a record
    that names another key (a collision, a file swapped under the store)
    is not served, and the row is forgotten, its files reported lost."""
    disk = {}
    lost = []
    index = Index(evicted=lambda m, reason: None, records=lambda oid, data: disk.get(data),
                  lost=lambda oid, data: lost.append(data), recent=1)
    a, b = on_disk("a"), on_disk("b")
    disk.update({a.data: a, b.data: b})
    index.add(a)
    index.add(b)  # a's record leaves the one-record memory of records read lately
    assert index.lookup(a.key) == a
    disk[b.data] = replace(b, key="http://h/other", url="http://h/other")
    index.lookup(a.key)  # b's record leaves the memory again
    assert index.lookup(b.key) is None and b.key not in index.slots
    assert lost == [b.data] and len(index) == 1 and index.usage.stored == 100


async def test_a_walk_over_every_object_reads_records_in_batches_and_skips_what_left_meanwhile():
    disk = {}
    index = Index(evicted=lambda m, reason: None, records=lambda oid, data: disk.get(data), recent=1)
    metas = [on_disk(f"o{i}") for i in range(10)]
    for m in metas:
        disk[m.data] = m
        index.add(m)
    index.add(meta("kept"))  # a name the index cannot find again: its record is kept in memory
    walked = []
    async for m in index.each_meta(batch=3):
        walked.append(m.key)
        if m.key == metas[0].key:
            index.drop(metas[4].slot)  # in a later batch: not given
    assert sorted(walked) == sorted([m.key for m in metas if m is not metas[4]] + ["http://h/kept"])


def test_a_newcomer_whose_write_fails_after_admission_leaves_the_policy_and_the_census_as_they_were():
    """The store judges a newcomer before its write, counts its miss only once it is added or refused
    (cachenode/store/small.py `admission`): a small body written at once, failed, then judged again by the fill
    that retried the write, which failed too, counted nothing; the write that lands counts one miss."""
    index, _ = indexed()
    assert commit(index, meta("a"), 1000)
    assert index.lookup("http://h/a") is not None  # a hit
    b = meta("b")

    def figures():
        return (index.census.hit_ratio(), index.census.working_set(), index.candidate(b),
                index.candidate(meta("c")), len(index), index.usage)

    before = figures()
    for _ in range(2):
        assert index.admits(b, index.candidate(b), 1000)  # admitted; then its write fails
    assert figures() == before
    assert commit(index, b, 1000)
    assert index.census.hit_ratio() == pytest.approx(1 / 3)  # a's miss and hit, b's one miss
    assert index.census.working_set() == 200
    assert index.candidate(b).count == 1


def test_a_newcomer_admitted_without_its_candidate_is_judged_as_with_it():
    """`admits(meta, None, ...)` (a sealed put's admission) works the candidate out only when a victim is
    weighed: two indexes fed the same misses under pressure, one given each candidate and one not, keep,
    refuse and evict alike."""
    rng = random.Random(11)
    given, worked_out = indexed(), indexed()
    for i in range(3000):
        m = meta(f"s{int(rng.paretovariate(1.1)) % 120}", size=rng.choice((50, 100, 150)), extra=i % 17 == 0)
        decisions = []
        for (index, _), judged in ((given, True), (worked_out, False)):
            if index.lookup(m.key) is not None:
                decisions.append("hit")
                continue
            admitted = index.admits(m, index.candidate(m) if judged else None, 2000)
            index.arrived(m)
            if admitted:
                index.add(m)
                index.evict_to(2000, keep=m.slot)
            decisions.append(admitted)
        assert decisions[0] == decisions[1]
    assert given[1] == worked_out[1] and given[1]
    assert given[0].evictions == worked_out[0].evictions and given[0].evictions["refused"] > 0
    assert list(given[0].policies["only"].victims()) == list(worked_out[0].policies["only"].victims())
