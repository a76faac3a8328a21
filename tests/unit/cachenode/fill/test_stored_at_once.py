"""Which stored answers are stored at once, before any client is answered
(`fill/lead.py` `stored_at_once`): a small 200 from the origin whose whole
body came with its head; every other answer streams as it comes."""

import pytest

from cachenode.fill.lead import Arrived, How, stored_at_once

SMALL = 128 * 1024
WHOLE = Arrived(status=200, method="GET", length=16384, buffered=16384, complete=True)


def test_a_small_200_whose_body_came_with_its_head_is_stored_at_once():
    assert stored_at_once(WHOLE, small_max=SMALL, how=How.STREAM)


def test_the_small_limit_itself_is_small_and_one_byte_more_is_not():
    at = Arrived(status=200, method="GET", length=SMALL, buffered=SMALL, complete=True)
    over = Arrived(status=200, method="GET", length=SMALL + 1, buffered=SMALL + 1, complete=True)
    assert stored_at_once(at, small_max=SMALL, how=How.STREAM)
    assert not stored_at_once(over, small_max=SMALL, how=How.STREAM)


@pytest.mark.parametrize("arrived, why", [
    (Arrived(status=200, method="GET", length=16384, buffered=4096, complete=False), "a body still coming"),
    (Arrived(status=200, method="GET", length=16384, buffered=16384, complete=False), "its end not yet read"),
    (Arrived(status=200, method="GET", length=None, buffered=16384, complete=True), "no Content-Length"),
    (Arrived(status=200, method="GET", length=0, buffered=0, complete=True), "an empty body"),
    (Arrived(status=404, method="GET", length=10, buffered=10, complete=True), "not a 200"),
    (Arrived(status=200, method="HEAD", length=16384, buffered=0, complete=True), "a HEAD's answer"),
    (Arrived(status=200, method="GET", length=16384, buffered=16384, complete=True, from_peer=True), "a peer's copy"),
    (Arrived(status=200, method="GET", length=16384, buffered=16384, complete=True, from_parent=True),
     "the parent tier's answer"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_every_other_answer_streams_as_it_comes(arrived, why):
    assert not stored_at_once(arrived, small_max=SMALL, how=How.STREAM), why


def test_a_body_the_plan_fetches_in_parallel_ranges_is_not_stored_at_once():
    assert not stored_at_once(WHOLE, small_max=SMALL, how=How.PARALLEL)


def test_no_small_objects_at_all_means_nothing_is_stored_at_once():
    assert not stored_at_once(WHOLE, small_max=0, how=How.STREAM)
