"""Before each test, what earlier tests left alive is out of the collector's walks (testkit/heap.py)."""

from __future__ import annotations

import gc
import weakref

from testkit.heap import FULL_EVERY, before_test

MADE_AT_IMPORT = [[]]  # a container the collector tracks, alive since this module was collected


class Cycle:
    """An object that refers to itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def walked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_an_object_alive_before_a_test_is_not_walked_by_a_collection_during_it():
    made_here = [[]]
    assert gc.is_tracked(MADE_AT_IMPORT)
    assert not walked(MADE_AT_IMPORT), "frozen before the test began"
    assert walked(made_here), "what the test makes is collected as ever"


def test_a_cycle_made_during_a_test_is_freed_by_a_collection_in_it():
    gone = weakref.ref(Cycle())
    gc.collect()
    assert gone() is None


def test_garbage_frozen_with_an_earlier_test_is_freed_by_the_next_full_pass_between_tests():
    cycle = Cycle()
    gone = weakref.ref(cycle)
    before_test(1)  # a test begins: the cycle, still alive, is frozen
    del cycle
    gc.collect()
    assert gone() is not None, "frozen: not freed by a collection during a test"
    for started in range(2, FULL_EVERY):
        before_test(started)
        assert gone() is not None
    before_test(FULL_EVERY)
    assert gone() is None, "the full pass between tests freed it"
    assert gc.get_freeze_count() > 0, "and froze what is alive again"
