"""Eviction passes over pinned objects without reading their records, and pins
count their bytes as a running sum (cachenode/store/room.py `_victim`,
cachenode/store/pins.py): what a pin call or an eviction costs does not grow
with the number of objects pinned."""

from __future__ import annotations

from cachenode.store.index import Index
from cachenode.store.objects import Meta
from cachenode.store.pins import Pins
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

    asked: list[str] = []

    def held(key: str) -> bool:
        asked.append(key)
        return pins.holds(key)

    index = Index(evicted=lambda m, reason: gone.append(m.key), records=read, recent=0,
                  protected=held, ended=pins.expire)
    pins.on_hold = index.protect
    for m in records.values():
        index.add(m, recent=False)
    pins.pin("Job/ml/a", [stored(n).key for n in range(40)])  # the 40 least recently used
    asked.clear()
    index.evict_to(100 * 45)
    assert gone == [stored(n).key for n in range(40, 45)]
    assert len(reads) <= 2 * len(gone), "a pinned candidate's record was read to find its key"
    # A pinned object waits out of the walk: no eviction asks of it.
    assert asked == []
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
    assert p.holds("a") and not p.holds("z")
