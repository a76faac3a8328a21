"""Prefetch fills at a lower priority than live requests, without sockets (cachenode/front/pacing.py)."""

from __future__ import annotations

import asyncio

import pytest

from cachenode.counts import LiveHits
from cachenode.front.pacing import HOLD, Pacing, admits

INF = float("inf")


@pytest.mark.parametrize("running, live_in_flight, since_live, expected", [
    # Live traffic (a request in flight, or one within `quiet`): `busy` fills at a time.
    (0, 1, INF, True),
    (1, 1, INF, False),
    (0, 0, 0.1, True),
    (1, 0, 0.1, False),
    (1, 3, 0.0, False),
    # Quiet for `quiet` seconds or more: `idle` fills at a time.
    (1, 0, 0.5, True),
    (1, 0, INF, True),
    (3, 0, 0.5, True),
    (4, 0, 0.5, False),
    (9, 0, INF, False),
])
def test_a_fill_starts_only_below_the_bound_of_the_moment(running, live_in_flight, since_live, expected):
    assert admits(running=running, live_in_flight=live_in_flight, since_live=since_live,
                  busy=1, idle=4, quiet=0.5) is expected


@pytest.mark.parametrize("running, live_in_flight, since_live, cap, expected", [
    (2, 0, INF, 3, True),  # quiet: the controller's cap, under the idle bound of 4
    (3, 0, INF, 3, False),
    (3, 0, INF, 8, True),  # a cap above the node's bound: the node's (4) holds
    (4, 0, INF, 8, False),
    (0, 1, INF, 3, True),  # live: one at a time, whatever the cap
    (1, 1, INF, 3, False),
])
def test_the_controllers_cap_bounds_the_fills_under_the_nodes_own_bound(running, live_in_flight, since_live, cap,
                                                                       expected):
    assert admits(running=running, live_in_flight=live_in_flight, since_live=since_live,
                  busy=1, idle=4, quiet=0.5, cap=cap) is expected


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_while_a_live_request_is_in_flight_one_fill_runs_and_the_next_starts_when_it_is_stored():
    pacing = Pacing(busy=1, idle=8, quiet=0.5, clock=Clock())
    pacing.live_began()
    await pacing.fill("h/a")
    second = asyncio.ensure_future(pacing.fill("h/b"))
    third = asyncio.ensure_future(pacing.fill("h/c"))
    await asyncio.sleep(0)
    assert (pacing.running, pacing.waiting) == (1, 2)
    pacing.stored("h/a")
    await asyncio.wait([second, third], return_when=asyncio.FIRST_COMPLETED)
    assert second.done() != third.done(), "exactly one waiter starts"
    assert (pacing.running, pacing.waiting) == (1, 1)
    pacing.live_ended()
    second.cancel(), third.cancel()
    await asyncio.gather(second, third, return_exceptions=True)


async def test_a_slot_given_back_starts_the_longest_waiting_fill_one_step_of_the_loop_later():
    """The waiter awaits its turn itself: through asyncio.wait it took two steps more, and with 16 fills of
    20 ms one slot in six stood empty (docs/benchmarks.md, "Every fill slot kept busy")."""
    pacing = Pacing(busy=1, idle=8, quiet=0.5, clock=Clock())
    pacing.live_began()
    await pacing.fill("h/a")
    second = asyncio.ensure_future(pacing.fill("h/b"))
    await asyncio.sleep(0)
    assert pacing.waiting == 1
    pacing.stored("h/a")
    await asyncio.sleep(0)  # one step
    assert pacing.filling("h/b") and pacing.waiting == 0
    await second
    pacing.live_ended()


async def test_a_fill_that_waited_past_its_own_timeout_leaves_no_turn_behind():
    pacing = Pacing(busy=1, idle=8, quiet=0.01, clock=Clock())
    pacing.live_began()
    await pacing.fill("h/a")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # several looks again after `quiet`, then given up
            await pacing.fill("h/b")
    assert pacing.waiting == 0 and not pacing._turns
    third = asyncio.ensure_future(pacing.fill("h/c"))
    await asyncio.sleep(0)
    pacing.stored("h/a")
    await asyncio.wait_for(third, timeout=1)
    assert pacing.filling("h/c"), "the slot went to the one still waiting"
    pacing.live_ended()


async def test_when_live_traffic_has_been_quiet_the_waiting_fills_start_up_to_the_idle_bound():
    clock = Clock()
    hits = LiveHits(clock=clock)  # a fast hit passes no middleware: Counts marks it here
    pacing = Pacing(busy=1, idle=3, quiet=0.01, clock=clock, hits=hits)
    hits.seen()
    await pacing.fill("h/a")
    waiting = [asyncio.ensure_future(pacing.fill(f"h/{n}")) for n in "bcde"]
    await asyncio.sleep(0)
    assert pacing.waiting == 4
    clock.now += 1.0  # the quiet has passed; the waiters look again after `quiet`

    async def three_running() -> None:
        while pacing.running < 3:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(three_running(), timeout=5)
    await asyncio.sleep(0.05)  # the other two looked again, and wait
    pending = [t for t in waiting if not t.done()]
    assert len(pending) == 2 and pacing.running == 3 and pacing.waiting == 2  # idle: 3
    assert pacing.started_while_live == 1  # only the first, before the quiet
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def test_a_fill_whose_check_never_comes_gives_its_slot_back_after_hold():
    clock = Clock()
    pacing = Pacing(busy=1, idle=1, quiet=0.01, clock=clock)
    await pacing.fill("h/a")
    clock.now += HOLD
    await asyncio.wait_for(pacing.fill("h/b"), timeout=5)
    assert pacing.running == 1 and pacing.started == 2


async def test_a_fill_asked_again_while_it_runs_is_not_queued_behind_itself():
    pacing = Pacing(busy=1, idle=1, quiet=0.5, clock=Clock())
    pacing.live_began()
    await pacing.fill("h/a")
    await asyncio.wait_for(pacing.fill("h/a"), timeout=5)
    assert pacing.running == 1 and pacing.waiting == 0


async def test_a_slot_given_back_wakes_only_the_longest_waiting_fill_and_the_others_do_not_look(monkeypatch):
    import cachenode.front.pacing as module

    looks = []
    monkeypatch.setattr(module, "admits", lambda **facts: looks.append(facts) or admits(**facts))
    pacing = Pacing(busy=1, idle=8, quiet=0.5, clock=Clock())
    pacing.live_began()
    await pacing.fill("h/a")
    waiting = [asyncio.ensure_future(pacing.fill(f"h/{n}")) for n in range(10)]
    await asyncio.sleep(0)
    assert pacing.waiting == 10
    looks.clear()
    pacing.stored("h/a")
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    assert [w.done() for w in waiting] == [True] + [False] * 9, "the first to come, alone"
    assert len(looks) == 1, "the nine others were not woken to look and wait again"
    pacing.live_ended()
    for w in waiting:
        w.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_fill_that_gives_up_after_being_woken_passes_its_turn_to_the_next():
    # `quiet` a minute: a waiter looks again on its own only after it, so within the 30 s below only the
    # turn passed on can have let the second in.
    pacing = Pacing(busy=1, idle=8, quiet=60, clock=Clock())
    pacing.live_began()
    await pacing.fill("h/a")
    first, second = (asyncio.ensure_future(pacing.fill(f"h/{n}")) for n in ("b", "c"))
    await asyncio.sleep(0)
    pacing.stored("h/a")  # first's turn...
    first.cancel()  # ...and first's request gives up before it looks
    await asyncio.wait_for(second, timeout=30)
    assert pacing.filling("h/c") and not pacing.filling("h/b")
    pacing.live_ended()
