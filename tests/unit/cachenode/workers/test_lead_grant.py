"""The grant decision of a follower's lead, and the leads kept (cachenode/workers/lead_grant.py)."""

from __future__ import annotations

from cachenode.fill.recent_fills import WINDOW, RecentFills
from cachenode.workers.lead_grant import Leads, may_grant

ORIGIN = "datasets"


def filled(n: int, *, small: bool, recent: RecentFills | None = None, origin: str = ORIGIN) -> RecentFills:
    recent = recent or RecentFills()
    for _ in range(n):
        recent.record(origin, small=small)
    return recent


def test_an_origin_never_filled_is_granted_no_lead() -> None:
    assert not may_grant(RecentFills(), ORIGIN, in_flight=False, stored=False)


def test_one_small_fill_seen_grants_and_one_large_one_does_not() -> None:
    assert may_grant(filled(1, small=True), ORIGIN, in_flight=False, stored=False)
    assert not may_grant(filled(1, small=False), ORIGIN, in_flight=False, stored=False)


def test_a_large_fill_among_the_first_is_not_tolerated_until_a_window_follows() -> None:
    recent = filled(1, small=True)
    filled(1, small=False, recent=recent)
    filled(WINDOW - 3, small=True, recent=recent)
    assert not may_grant(recent, ORIGIN, in_flight=False, stored=False)
    filled(1, small=True, recent=recent)
    assert may_grant(recent, ORIGIN, in_flight=False, stored=False)


def test_no_lead_while_a_flight_is_under_way_or_an_object_is_stored() -> None:
    recent = filled(WINDOW, small=True)
    assert not may_grant(recent, ORIGIN, in_flight=True, stored=False)
    assert not may_grant(recent, ORIGIN, in_flight=False, stored=True)


def test_one_large_fill_in_the_window_is_tolerated_two_are_not() -> None:
    recent = filled(WINDOW - 1, small=True)
    recent.record(ORIGIN, small=False)
    assert may_grant(recent, ORIGIN, in_flight=False, stored=False)
    recent.record(ORIGIN, small=False)
    assert not may_grant(recent, ORIGIN, in_flight=False, stored=False)


def test_a_dataset_of_large_files_stops_being_granted_and_small_ones_win_it_back() -> None:
    recent = filled(WINDOW, small=True)
    filled(2, small=False, recent=recent)
    assert not recent.small(ORIGIN)
    # The large fills leave the window only after WINDOW small ones followed them.
    filled(WINDOW - 2, small=True, recent=recent)
    assert not recent.small(ORIGIN)
    filled(1, small=True, recent=recent)
    assert recent.small(ORIGIN)


def test_origins_are_judged_apart() -> None:
    recent = filled(WINDOW, small=True)
    filled(WINDOW, small=False, recent=recent, origin="videos")
    assert recent.small(ORIGIN)
    assert not recent.small("videos")


def test_a_key_has_one_leader() -> None:
    leads = Leads()
    assert leads.take("k", 1)
    assert not leads.take("k", 2)
    assert leads.holder("k") == 1


def test_an_outcome_from_a_follower_not_holding_the_lead_is_not_obeyed() -> None:
    leads = Leads()
    leads.take("k", 1)
    assert not leads.release("k", 2)
    assert leads.release("k", 1)
    assert not leads.release("k", 1)
    assert leads.holder("k") is None and len(leads) == 0


def test_a_followers_death_releases_its_leads_and_only_its() -> None:
    leads = Leads()
    leads.take("a", 1)
    leads.take("b", 1)
    leads.take("c", 2)
    assert leads.release_worker(1) == ["a", "b"]
    assert leads.holder("a") is None and leads.holder("b") is None
    assert leads.holder("c") == 2
    assert leads.release_worker(1) == []
    assert leads.take("a", 2)
