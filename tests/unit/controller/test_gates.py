"""controller/gates.py: which held pods the controller lets go, and when the next one's wait ends."""

from __future__ import annotations

import pytest

from controller.gates import DONE, SPREADING, UNFOLLOWED, UNKNOWN, Verdict, created_at, decide


@pytest.mark.parametrize("state, created, now, expected", [
    (DONE, 1000.0, 1001.0, Verdict(True, "spread")),
    (UNFOLLOWED, 1000.0, 1001.0, Verdict(True, "nothing spreads for it")),
    (SPREADING, 1000.0, 1001.0, Verdict(False, until=1600.0)),
    (UNKNOWN, 1000.0, 1599.9, Verdict(False, until=1600.0)),
    (SPREADING, 1000.0, 1600.0, Verdict(True, "waited its longest", late=True)),
    (UNKNOWN, 1000.0, 9000.0, Verdict(True, "waited its longest", late=True)),
    (SPREADING, None, 1000.0, Verdict(False, until=1600.0)),  # no creation time: its wait starts now
])
def test_a_pod_goes_once_its_spread_is_done_or_moot_and_else_at_the_end_of_its_wait(state, created, now, expected):
    assert decide(state=state, created=created, now=now, wait=600.0) == expected


def test_the_creation_time_is_read_from_the_pods_metadata():
    assert created_at({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}}) == 1767225600.0
    assert created_at({"metadata": {}}) is None
    assert created_at({"metadata": {"creationTimestamp": "yesterday"}}) is None
