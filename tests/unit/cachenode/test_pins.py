"""cachenode/store/pins.py: what a workload pins, within the share, and for how long after it ends."""

from __future__ import annotations

from cachenode.store.pins import Pinned, Pins


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pins(capacity: int | None = 1000, sizes: dict[str, int] | None = None) -> tuple[Pins, Clock]:
    clock = Clock()
    sizes = sizes if sizes is not None else {"a": 300, "b": 300, "c": 300, "d": 300}
    return Pins(capacity=capacity, size_of=sizes.get, clock=clock), clock


def test_pins_fit_the_share_and_the_rest_is_refused_saying_how_much_is_left():
    p, _ = pins()
    assert p.pin("Job/ml/a", ["a", "b", "c", "d", "zz"]) == Pinned(
        pinned=3, pinned_bytes=900, refused=1, refused_bytes=300, missing=1, room=100)
    assert [p.holds(k) for k in "abcd"] == [True, True, True, False]
    assert p.used() == 900


def test_an_object_two_workloads_pin_counts_once_against_the_share():
    p, _ = pins()
    p.pin("Job/ml/a", ["a", "b"])
    assert p.pin("Deployment/ml/b", ["b", "c"]) == Pinned(pinned=2, pinned_bytes=600, room=100)
    assert p.by_workload() == {"Job/ml/a": 600, "Deployment/ml/b": 600}


def test_a_released_workloads_pins_hold_for_keep_seconds_then_end():
    p, clock = pins()
    p.pin("Job/ml/a", ["a"])
    p.pin("Job/ml/b", ["b"])
    assert p.release("Job/ml/a", 3600) == 1
    clock.now += 3599
    assert p.holds("a") and p.holds("b")
    clock.now += 2
    assert not p.holds("a") and p.holds("b")
    assert p.by_workload() == {"Job/ml/b": 300} and p.used() == 300


def test_an_object_another_workload_still_uses_stays_pinned_when_one_is_released():
    p, clock = pins()
    p.pin("Job/ml/a", ["a"])
    p.pin("Job/ml/b", ["a"])
    p.release("Job/ml/a", 0)
    clock.now += 1
    assert p.holds("a") and p.by_workload() == {"Job/ml/b": 300}


def test_pinning_again_after_a_release_holds_while_the_workload_exists():
    p, clock = pins()
    p.pin("Job/ml/a", ["a"])
    p.release("Job/ml/a", 10)
    p.pin("Job/ml/a", ["a"])
    clock.now += 100
    assert p.holds("a")


def test_without_a_capacity_nothing_is_refused():
    p, _ = pins(capacity=None)
    assert p.pin("Job/ml/a", ["a", "b", "c", "d"]) == Pinned(pinned=4, pinned_bytes=1200, room=None)


def test_pins_saved_and_restored_hold_as_before_and_those_past_their_end_are_dropped():
    p, clock = pins()
    p.pin("Job/ml/a", ["a", "b"])
    p.pin("Job/ml/b", ["c"])
    p.release("Job/ml/b", 60)
    saved = p.snapshot()
    assert saved == {"a": {"Job/ml/a": None}, "b": {"Job/ml/a": None}, "c": {"Job/ml/b": 1060.0}}

    later, clock2 = pins()
    clock2.now = 1000.0
    assert later.restore(saved) == 3
    assert later.by_workload() == {"Job/ml/a": 600, "Job/ml/b": 300}
    clock2.now = 1061.0
    assert [later.holds(k) for k in "abc"] == [True, True, False]

    gone, clock3 = pins()
    clock3.now = 2000.0
    assert gone.restore(saved) == 2, "a pin past its end is not taken back"


def test_every_pin_and_release_that_changes_something_is_told_and_nothing_else():
    told = []
    p = Pins(capacity=1000, size_of={"a": 300}.get, changed=lambda: told.append(1))
    p.pin("Job/ml/a", ["zz"])  # not stored here: nothing pinned
    p.release("Job/ml/b", 5)  # pinned nothing
    assert told == []
    p.pin("Job/ml/a", ["a"])
    p.release("Job/ml/a", 5)
    assert len(told) == 2
