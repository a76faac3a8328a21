"""How a fill reads the body it stores (cachenode/fill/lead.py, plan_fill)."""

from __future__ import annotations

import itertools

import pytest

from cachenode.fill.lead import Body, How, Plan, plan_fill


def body(**changes) -> Body:
    """An origin's answer with a length and a validator, large enough for parallel ranges."""
    return Body(**{"from_peer": False, "delimited_by_close": False, "rangeable": True, "client_ranged": False,
                   **changes})


@pytest.mark.parametrize("given, splice_fills, fill_on_range, expected", [
    # A large object with a validator is fetched in parallel ranges, spliced or not.
    (body(), True, True, Plan(How.PARALLEL)),
    (body(), False, True, Plan(How.PARALLEL)),
    # A client's Range makes it fetch on demand, unless fill_on_range says fill it all.
    (body(client_ranged=True), True, False, Plan(How.PARALLEL, on_demand=True)),
    (body(client_ranged=True), True, True, Plan(How.PARALLEL)),
    (body(client_ranged=False), True, False, Plan(How.PARALLEL)),
    # No ranges of a body only the close ends, of a copy from a peer, or of one fill/parallel.py turned down.
    (body(delimited_by_close=True), True, True, Plan(How.SPLICED)),
    (body(from_peer=True), True, True, Plan(How.SPLICED)),
    (body(from_peer=True, client_ranged=True), False, False, Plan(How.STREAM)),
    # Nor of the parent tier's answer (--parent): the parent fetched the origin's in ranges already;
    # and it is streamed, never spliced, so the origin's rest can be joined on if the parent breaks off.
    (body(from_parent=True), True, True, Plan(How.STREAM)),
    (body(from_parent=True, client_ranged=True), False, False, Plan(How.STREAM)),
    (body(rangeable=False), True, True, Plan(How.SPLICED)),
    # One stream: spliced when splice_fills is on, else through aiohttp's reader.
    (body(rangeable=False), False, True, Plan(How.STREAM)),
    (body(delimited_by_close=True, client_ranged=True), False, False, Plan(How.STREAM)),
])
def test_a_fill_reads_its_body_the_way_its_facts_and_settings_call_for(given, splice_fills, fill_on_range,
                                                                        expected):
    assert plan_fill(given, splice_fills=splice_fills, fill_on_range=fill_on_range) == expected


@pytest.mark.parametrize("splice_fills", [True, False])
def test_a_fill_asked_with_the_callers_own_credentials_is_never_cut_into_range_requests(splice_fills):
    """An `authorize` origin's fill is the caller's request as signed: range
    requests in its name are requests it never made (and may outlive it)."""
    plan = plan_fill(body(callers_own=True), splice_fills=splice_fills, fill_on_range=True)
    assert plan == Plan(How.SPLICED if splice_fills else How.STREAM)


@pytest.mark.parametrize("splice_fills", [True, False])
def test_a_copy_that_goes_on_from_another_source_is_spliced_as_any_peers_copy(splice_fills):
    """A streaming copy (cluster/streaming_copies.py) is spliced into its file like any copy from a peer;
    when its owner breaks off, the rest is joined on in Python from the byte the file reached
    (`Fill.run_spliced`'s `rest`), so going on no longer costs the loop every byte."""
    plan = plan_fill(body(from_peer=True, goes_on=True), splice_fills=splice_fills, fill_on_range=True)
    assert plan == Plan(How.SPLICED if splice_fills else How.STREAM)


@pytest.mark.parametrize("splice_fills", [False, True])
@pytest.mark.parametrize("fill_on_range", [False, True])
def test_a_body_not_worth_ranges_is_never_planned_in_ranges_whatever_else_holds(splice_fills, fill_on_range):
    # `FillRuns.whole_and_small` builds no plan for a small answer without a
    # parallel validator (fill/running.py): it rests on this.
    flags = ("from_peer", "delimited_by_close", "client_ranged", "callers_own", "from_parent", "small", "goes_on")
    for values in itertools.product([False, True], repeat=len(flags)):
        body = Body(rangeable=False, resumed=False, **dict(zip(flags, values)))
        assert plan_fill(body, splice_fills=splice_fills, fill_on_range=fill_on_range).how is not How.PARALLEL, body
