"""The primary's desk of followers' leads (cachenode/workers/lead_desk.py): an
origin probed before any lead of it is granted, asks held meanwhile, and a
follower's death releasing what it led and asked."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from cachenode.fill.engine import LeaderGone
from cachenode.fill.flights import Flights, Kind
from cachenode.fill.recent_fills import WINDOW, RecentFills
from cachenode.store.small import record_of, sealed_meta, well_named
from cachenode.workers.lead_desk import HOLD_SECONDS, LeadDesk
from cachenode.workers.messages import Granted
from nezha.keys import object_id

HOST = "datasets.example"


class _Counter:
    def labels(self, *args, **kwargs):
        return self

    def inc(self, n=1):
        pass

    def observe(self, v):
        pass


def desk_of(*, now: list[float]):
    sent: list[tuple[int, Granted]] = []
    outcomes: list[str] = []
    recent = RecentFills()
    node = SimpleNamespace(
        engine=SimpleNamespace(flights=Flights(), runs=SimpleNamespace(digests=None), replicate=lambda m, t: None),
        store=SimpleNamespace(lookup=lambda key: None, index=SimpleNamespace(varies=lambda key: False), loading=False),
        cluster=SimpleNamespace(owners=lambda key: []), node_id="node0",
        counts=SimpleNamespace(live=SimpleNamespace(seen=lambda: None)),
        metrics=SimpleNamespace(fill_duration=_Counter(), bytes_from_origin=_Counter()),
        upstream=SimpleNamespace(parent=None), settings=SimpleNamespace(follower_leads=True),
        handler=SimpleNamespace(misses=SimpleNamespace(recent=recent)))
    desk = LeadDesk(node, send=lambda worker, message: sent.append((worker, message)), outcome=outcomes.append,
                    clock=lambda: now[0])
    return desk, recent, node, sent, outcomes


def granted(desk, recent, node):
    """Worker 1 granted the lead of HOST/a, its origin shown small: the flight the primary holds for it."""
    recent.record(HOST, small=True)
    assert desk.asked(1, 1, f"{HOST}/a", HOST, "/a") is True
    return node.engine.flights.get(f"{HOST}/a")


def left_to_its_joiners(flight, node) -> bool:
    """Whether `flight` ended with the leader gone (its joiners lead) and the key is no flight any more."""
    outcome = flight.outcome.result()
    return (outcome.kind is Kind.FAILED and isinstance(outcome.error, LeaderGone)
            and node.engine.flights.get(flight.key) is None)


async def test_an_origin_no_fill_has_shown_is_probed_and_the_asks_meanwhile_are_held_then_granted():
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    assert desk.asked(1, 1, f"{HOST}/a", HOST, "/a") is False  # the probe: the primary fills it
    assert desk.asked(1, 2, f"{HOST}/b", HOST, "/b") is None  # held
    assert desk.asked(1, 3, f"{HOST}/c", HOST, "/c") is None
    await asyncio.sleep(0.02)
    assert sent == []  # still held: no fill of the origin has shown yet
    recent.record(HOST, small=True)  # the probe's fill: small
    for _ in range(100):
        if len(sent) == 2:
            break
        await asyncio.sleep(0.01)
    assert sent == [(1, Granted(n=2, ok=True)), (1, Granted(n=3, ok=True))]
    assert node.engine.flights.get(f"{HOST}/b") is not None and node.engine.flights.get(f"{HOST}/c") is not None
    assert outcomes == ["denied"]


async def test_asks_held_for_an_origin_whose_probe_shows_nothing_are_denied_after_the_hold():
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    assert desk.asked(1, 1, f"{HOST}/a", HOST, "/a") is False
    assert desk.asked(1, 2, f"{HOST}/b", HOST, "/b") is None
    now[0] += HOLD_SECONDS  # the probe's fill failed: nothing recorded
    for _ in range(100):
        if sent:
            break
        await asyncio.sleep(0.01)
    assert sent == [(1, Granted(n=2, ok=False))]
    assert node.engine.flights.get(f"{HOST}/b") is None
    assert desk.asked(1, 3, f"{HOST}/c", HOST, "/c") is False  # probed again


async def test_an_origin_whose_fill_was_large_is_denied_and_the_held_asks_with_it():
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    desk.asked(1, 1, f"{HOST}/a", HOST, "/a")
    assert desk.asked(1, 2, f"{HOST}/b", HOST, "/b") is None
    recent.record(HOST, small=False)
    for _ in range(100):
        if sent:
            break
        await asyncio.sleep(0.01)
    assert sent == [(1, Granted(n=2, ok=False))]
    assert desk.asked(1, 3, f"{HOST}/c", HOST, "/c") is False


async def test_a_followers_death_aborts_the_flights_it_led_and_drops_its_held_asks():
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    flight = granted(desk, recent, node)
    assert desk.asked(2, 1, f"{HOST}/a", HOST, "/a") is False  # one leader per key
    desk.gone(1)
    assert left_to_its_joiners(flight, node)
    assert outcomes == ["denied", "lost"]
    desk.done(1, f"{HOST}/a", None, 0.0)  # an end after the lead was released: not obeyed
    assert outcomes == ["denied", "lost"]


async def test_a_record_this_version_cannot_read_declines_the_lead_and_its_joiners_lead():
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    flight = granted(desk, recent, node)
    desk.done(1, f"{HOST}/a", {"not": "a meta"}, 0.0)
    assert left_to_its_joiners(flight, node)
    assert outcomes == ["declined"]
    assert recent.small(HOST), "a lead that failed is no sign the origin's objects are large"


async def test_a_lead_declined_for_a_large_answer_stops_the_origins_grants():
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    recent.record(HOST, small=True)
    assert desk.asked(1, 1, f"{HOST}/a", HOST, "/a") is True
    desk.done(1, f"{HOST}/a", None, 0.0, large=True)
    assert outcomes == ["declined"] and not recent.small(HOST)
    assert desk.asked(1, 2, f"{HOST}/b", HOST, "/b") is False


async def test_no_lead_is_granted_while_the_index_loads():
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    recent.record(HOST, small=True)
    node.store.loading = True
    assert desk.asked(1, 1, f"{HOST}/a", HOST, "/a") is False
    node.store.loading = False
    assert desk.asked(1, 2, f"{HOST}/a", HOST, "/a") is True


async def test_a_record_naming_a_file_outside_its_slot_is_never_admitted_nor_deleted():
    """The store admits, or deletes, only a sealed file of the key's own slot: a record naming another
    path (a fault in a follower) declines the lead and touches no file (the fake store has no admit_sealed
    or drop_sealed: any call would fail the test)."""
    now = [100.0]
    desk, recent, node, sent, outcomes = desk_of(now=now)
    recent.record(HOST, small=True)
    key = f"{HOST}/a"
    meta = sealed_meta(10, key=key, url=key, host=HOST, headers=(), stored_at=1.0, expires_at=2.0)
    assert well_named(meta)
    for data in ("../../etc/passwd", f"{object_id(f'{HOST}/b')}.00000000000a.obj", f"{meta.data}.data"):
        for _ in range(WINDOW):  # a declined lead counts as a fill not small: the origin shown small again
            recent.record(HOST, small=True)
        assert desk.asked(1, 1, key, HOST, "/a") is True
        desk.done(1, key, record_of(replace(meta, data=data)), 0.0)
        assert outcomes[-1] == "declined" and node.engine.flights.get(key) is None
