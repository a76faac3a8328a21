"""A leader's coroutine closed where no loop runs (a pending task destroyed
once its loop has stopped) still aborts its flight, as when a flight made its
outcome future at once: asking whether a flight is resolved needs no loop."""

from __future__ import annotations

import asyncio
import types
from types import SimpleNamespace

from cachenode.fill.flights import Flight, Flights, Kind, Outcome
from cachenode.front.fast_misses import FastMisses, Miss
from nezha.keys import Target


@types.coroutine
def _suspended():
    yield  # the origin not answered yet


def _leader(flights: Flights) -> tuple[FastMisses, Flight]:
    async def engine_lead(flight, **_):
        await _suspended()

    misses = FastMisses.__new__(FastMisses)
    misses.pacing = SimpleNamespace(live_began=lambda: None, live_ended=lambda: None)
    misses.small_gets = None
    misses.engine = SimpleNamespace(lead=engine_lead, flights=flights)

    async def led() -> Flight:  # every flight is led on the event loop
        return flights.lead_or_join("http://o.example/a")[0]

    return misses, asyncio.run(led())


def test_a_leader_closed_outside_its_loop_aborts_its_flight():
    flights = Flights()
    misses, flight = _leader(flights)
    target = Target("http", "o.example", "/a", "")
    coro = misses.lead(Miss(flight.key, "http://o.example/a", target, None, {}, {}, flight), interim=None)
    coro.send(None)  # suspended where the origin is asked
    coro.close()  # no loop runs: a destroyed task's coroutine is closed so
    assert flights.get(flight.key) is None  # landed: joiners look again

    async def outcome() -> Outcome:
        return await flight.outcome

    assert asyncio.run(outcome()).kind is Kind.FAILED



def test_whether_a_flight_is_resolved_is_its_outcome_futures_done():
    async def run() -> None:
        asked = Flight("k")  # its future made before its outcome
        assert not asked.resolved() and not asked.outcome.done()
        asked.resolve(Outcome(Kind.PASSED))
        assert asked.resolved() and asked.outcome.done()
        unasked = Flight("k2")  # its outcome given before anyone asked for the future
        assert not unasked.resolved()
        unasked.resolve(Outcome(Kind.STORED))
        unasked.resolve(Outcome(Kind.FAILED))  # the first stands
        assert unasked.resolved() and unasked.outcome.done() and unasked.outcome.result().kind is Kind.STORED

    asyncio.run(run())
