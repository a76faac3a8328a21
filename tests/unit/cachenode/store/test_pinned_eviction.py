"""Eviction passes over pinned objects without reading their records, and pins
count their bytes as a running sum (cachenode/store/index.py `_candidates`,
cachenode/store/pins.py): what a pin call or an eviction costs does not grow
with the number of objects pinned."""

from __future__ import annotations

from cachenode.store.index import Index
from cachenode.store.objects import Meta
from cachenode.store.pins import Pins, slot_hash
from nezha.keys import object_id


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stored(n: int) -> Meta:
    key = f"http://h/{n}"
    return Meta(key=key, url=key, host="h", size=100, headers=(), stored_at=0.0, expires_at=60.0,
                data=f"{object_id(key)}.{n:012x}.obj")


def test_an_eviction_passes_over_pinned_objects_without_reading_their_records():
    records = {m.data: m for m in map(stored, range(50))}
    reads: list[str] = []
    sizes = {m.key: m.size for m in records.values()}
    pins = Pins(capacity=None, size_of=sizes.get)
    gone: list[str] = []

    def read(oid: str, data: str) -> Meta | None:
        reads.append(data)
        return records.get(data)

    asked: list[int] = []

    def held(h: int) -> bool:
        asked.append(h)
        return pins.holds_hash(h)

    index = Index(evicted=lambda m, reason: gone.append(m.key), records=read, recent=0,
                  protected=pins.holds, protected_hash=held)
    for m in records.values():
        index.add(m, recent=False)
    pins.pin("Job/ml/a", [stored(n).key for n in range(40)])  # the 40 least recently used
    index.evict_to(100 * 45)
    assert gone == [stored(n).key for n in range(40, 45)]
    assert len(reads) <= 2 * len(gone), "a pinned candidate's record was read to find its key"
    # Passed over once, a pinned object waits at the back: the next evictions do not ask of it again.
    assert len(asked) <= 40 + 2 * len(gone)
    pins.release("Job/ml/a", 0)
    index.evict_to(100 * 40)
    assert len(gone) == 10, "released, the pinned objects go as any other"


def test_pins_that_end_leave_the_running_sum_and_a_pin_again_counts_the_size_now():
    clock = Clock()
    sizes = {"a": 300, "b": 300, "c": 300}
    p = Pins(capacity=1000, size_of=sizes.get, clock=clock)
    p.pin("Job/ml/a", ["a", "b"])
    p.pin("Job/ml/b", ["c"])
    p.release("Job/ml/a", 10)
    clock.now += 11
    assert p.used() == 300 and not p.holds("a")
    sizes["c"] = 500  # replaced by a larger version
    assert p.pin("Job/ml/b", ["c"]).room == 500 and p.used() == 500


def test_restored_pins_are_measured_once_when_first_counted():
    asked: list[str] = []
    sizes = {"a": 300, "b": 200}

    def size_of(key: str) -> int | None:
        asked.append(key)
        return sizes.get(key)

    p = Pins(capacity=1000, size_of=size_of)
    assert p.restore({"a": {"Job/ml/a": None}, "b": {"Job/ml/a": None}}) == 2
    assert asked == []
    assert p.used() == 500 and p.used() == 500
    assert sorted(asked) == ["a", "b"]
    assert p.holds_hash(slot_hash("a")) and not p.holds_hash(slot_hash("z"))
