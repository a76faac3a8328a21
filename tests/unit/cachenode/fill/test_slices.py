"""The parallel fill's schedule (cachenode/fill/slices.py): front first, every byte once, no range ever cut."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachenode.fill.slices import Plan

MiB = 1 << 20


def test_slices_are_handed_out_front_first():
    plan = Plan(10 * MiB, 2 * MiB)
    first = plan.next()
    assert (first.start, first.end) == (0, 2 * MiB)
    assert [plan.next().start for _ in range(4)] == [2 * MiB, 4 * MiB, 6 * MiB, 8 * MiB]


def test_the_prefix_grows_only_over_contiguous_bytes():
    plan = Plan(6 * MiB, 2 * MiB)
    a, b, c = plan.next(), plan.next(), plan.next()
    plan.advance(c, 2 * MiB)
    plan.advance(b, MiB)
    assert plan.prefix == 0
    plan.advance(a, 2 * MiB)
    assert plan.prefix == 3 * MiB
    plan.advance(b, MiB)
    assert plan.prefix == 6 * MiB and plan.complete


def test_a_slice_in_progress_is_never_cut_or_handed_out_again_however_slow():
    """Cutting a slow range closed its answer with the origin's bytes in
    flight on it: the origin sent more than the object (issue 26)."""
    plan = Plan(8 * MiB, 4 * MiB)
    slow, other = plan.next(), plan.next()
    plan.advance(other, 4 * MiB)
    plan.advance(slow, MiB)
    assert plan.next() is None and plan.next_wanted() is None
    assert (slow.start, slow.end) == (0, 4 * MiB)
    plan.want(2 * MiB, 3 * MiB)  # a client waiting inside it changes nothing either
    assert plan.next() is None and slow.end == 4 * MiB


def test_advancing_past_a_slice_end_is_a_bug_not_a_silent_overlap():
    plan = Plan(2 * MiB, MiB)
    s = plan.next()
    with pytest.raises(ValueError):
        plan.advance(s, MiB + 1)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 64 * MiB), slice_size=st.integers(MiB // 4, 16 * MiB), streams=st.integers(1, 9),
       seed=st.integers(0, 2 ** 32))
def test_every_byte_is_covered_exactly_once_whatever_the_order_of_progress(total, slice_size, streams, seed):
    rng = random.Random(seed)
    plan = Plan(total, slice_size)
    active = [plan.next()]
    while len(active) < streams and (s := plan.next()) is not None:
        active.append(s)
    written = []
    while active:
        s = rng.choice(active)
        if s.done:
            active.remove(s)
            nxt = plan.next()
            if nxt is not None:
                active.append(nxt)
            continue
        n = min(s.remaining, rng.randint(1, MiB))
        written.append((s.pos, s.pos + n))
        plan.advance(s, n)
    assert plan.complete and plan.prefix == total
    written.sort()
    assert written[0][0] == 0 and written[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(written, written[1:]))  # no gap, no overlap


def test_slices_a_client_waits_for_go_before_the_front():
    plan = Plan(20 * MiB, 2 * MiB)
    plan.next()
    plan.want(13 * MiB, 15 * MiB)
    assert [plan.next().start for _ in range(3)] == [12 * MiB, 14 * MiB, 2 * MiB]


def test_coverage_beyond_the_prefix_is_the_contiguous_run_from_an_offset():
    plan = Plan(8 * MiB, 2 * MiB)
    a = plan.next()
    b, c, d = plan.next(), plan.next(), plan.next()
    plan.advance(c, 2 * MiB)
    plan.advance(d, MiB)
    assert plan.covered_until(4 * MiB + 10) == 7 * MiB  # through c, into d
    assert plan.covered_until(7 * MiB) == 7 * MiB  # not on disk yet
    assert plan.covered_until(2 * MiB) == 2 * MiB and plan.prefix == 0
    plan.advance(a, 2 * MiB)
    assert plan.covered_until(MiB) == 2 * MiB
    plan.advance(b, 2 * MiB)
    assert plan.covered_until(0) == 7 * MiB


def test_on_demand_only_slices_a_client_waits_for_are_handed_out():
    plan = Plan(100, 10, on_demand=True)
    assert plan.next() is None, "nobody asked: nothing is fetched"
    plan.want(42, 58)
    got = [plan.next(), plan.next()]
    assert [(s.start, s.end) for s in got] == [(40, 50), (50, 60)]
    assert not plan.has_unclaimed_wanted()
    assert plan.next() is None, "never an unwanted slice"


def test_on_demand_a_want_already_on_disk_asks_for_nothing_more():
    plan = Plan(100, 10, on_demand=True)
    plan.want(20, 25)
    s = plan.next()
    plan.advance(s, 10)
    assert plan.on_disk() == 10 and plan.covered_until(20) == 30
    plan.want(21, 29)
    assert not plan.has_unclaimed_wanted() and plan.next() is None
    plan.want(0, 100)  # a whole-object request wants every slice
    assert [s.start for s in iter(plan.next, None)] == [0, 10, 30, 40, 50, 60, 70, 80, 90]


def test_a_client_asking_again_for_what_it_asked_adds_no_want():
    plan = Plan(100, 10, on_demand=True)
    for _ in range(1000):
        plan.want(5, 100)
    plan.want(20, 30)
    assert len(plan._wanted) == 1


def test_a_resumes_answer_is_one_slice_claimed_from_the_start_and_the_rest_is_cut_around_it():
    plan = Plan(20 * MiB, 8 * MiB, answered=(5 * MiB, 20 * MiB))
    assert [(s.start, s.end) for s in plan.slices] == [(0, 5 * MiB), (5 * MiB, 20 * MiB)]
    assert (plan.answered_slice.start, plan.answered_slice.end) == (5 * MiB, 20 * MiB)
    head = plan.next()
    assert (head.start, head.end) == (0, 5 * MiB)
    assert plan.next() is None, "the answered span is never asked for again"
    plan.want(6 * MiB, 20 * MiB)  # a client waiting inside the answered span asks for nothing more
    assert plan.next() is None and not plan.has_unclaimed_wanted()
    plan.advance(plan.answered_slice, 2 * MiB)
    assert plan.covered_until(5 * MiB) == 7 * MiB and plan.prefix == 0
    plan.advance(head, 5 * MiB)
    assert plan.prefix == 7 * MiB


def test_an_answered_span_in_the_middle_leaves_slices_before_and_after_it():
    plan = Plan(30 * MiB, 8 * MiB, answered=(10 * MiB, 12 * MiB))
    assert [(s.start // MiB, s.end // MiB) for s in plan.slices] == [(0, 8), (8, 10), (10, 12), (12, 20),
                                                                     (20, 28), (28, 30)]
    assert [s.start // MiB for s in iter(plan.next, None)] == [0, 8, 12, 20, 28]


@pytest.mark.parametrize("answered", [(0, 0), (5, 4), (-1, 3), (0, 101)])
def test_an_answered_span_outside_the_object_is_refused(answered):
    with pytest.raises(ValueError, match="not inside an object of 100"):
        Plan(100, 10, answered=answered)
