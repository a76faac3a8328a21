"""Which way a client's request goes (cachenode/front/route.py): each row of the request path."""

from __future__ import annotations

import pytest

from cachenode.front.route import Facts, Read, Route, route


def read(**changes) -> Read:
    """A plain read (no authorize) of nothing fresh here, this node its first owner, with `changes`."""
    return Read(**{"authorize": False, "fresh": False, "only_if_cached": False, "owners_ahead": False, **changes})


@pytest.mark.parametrize("facts, expected", [
    # A peer's chunk request is the chunk owner's, before anything else; a POST with the field is not.
    (Facts("GET", chunk=True, looped=True, bypass="Authorization"), Route.CHUNK),
    (Facts("HEAD", chunk=True), Route.CHUNK),
    (Facts("POST", chunk=True), Route.FORWARD),
    # A peer's question of why an answer was cut: about a chunk, the chunk owner's; else the node's own, before
    # anything that could fill or relay; only a GET asks it.
    (Facts("GET", chunk=True, cut=True), Route.CHUNK),
    (Facts("GET", cut=True, looped=True, bypass="Authorization", read=read(owners_ahead=True)), Route.CUT),
    (Facts("HEAD", cut=True), Route.LOOK),
    (Facts("POST", cut=True), Route.FORWARD),
    # A loop is refused whatever the method.
    (Facts("GET", looped=True), Route.LOOP),
    (Facts("PUT", looped=True), Route.LOOP),
    # Another method is forwarded, never looked up; a bypass is never looked up either.
    (Facts("DELETE", bypass="request carries Cookie"), Route.FORWARD),
    (Facts("GET", bypass="request carries Cookie"), Route.BYPASS),
    (Facts("HEAD", bypass="request URL carries credentials (user)", read=read(fresh=True)), Route.BYPASS),
    # Until the store is looked up, a cacheable read asks to look.
    (Facts("GET"), Route.LOOK),
    (Facts("HEAD"), Route.LOOK),
    # only-if-cached with nothing here that answers: 504, before any owner is asked.
    (Facts("GET", read=read(only_if_cached=True, owners_ahead=True)), Route.UNCACHED),
    (Facts("GET", read=read(only_if_cached=True, fresh=True)), Route.HIT),
    # Owners ahead are asked first, a signed read's too.
    (Facts("GET", read=read(owners_ahead=True)), Route.RELAY),
    (Facts("HEAD", read=read(owners_ahead=True)), Route.RELAY),
    (Facts("GET", read=read(owners_ahead=True, authorize=True)), Route.RELAY),
    # A HEAD is a hit only from a fresh copy of a plain origin; else the origin answers it.
    (Facts("HEAD", read=read(fresh=True)), Route.HIT),
    (Facts("HEAD", read=read()), Route.PASS),
    (Facts("HEAD", read=read(fresh=True, authorize=True)), Route.PASS),
    # A signed GET is the origin's to allow, held here or not.
    (Facts("GET", read=read(authorize=True)), Route.AUTHORIZE),
    (Facts("GET", read=read(authorize=True, fresh=True)), Route.AUTHORIZE),
    (Facts("GET", read=read(authorize=True, fresh=True, only_if_cached=True)), Route.AUTHORIZE),
    # A plain GET: a hit from a fresh copy, else the read loop fills.
    (Facts("GET", read=read(fresh=True)), Route.HIT),
    (Facts("GET", read=read()), Route.FILL),
])
def test_each_request_takes_the_row_that_wins_first(facts, expected):
    assert route(facts) is expected


def test_owners_that_did_not_answer_leave_the_read_to_this_node():
    """A relay no owner answered is routed again as if this node were the first owner."""
    relayed = Facts("GET", read=read(owners_ahead=True))
    assert route(relayed) is Route.RELAY
    assert route(relayed.owners_silent()) is Route.FILL
    head = Facts("HEAD", read=read(owners_ahead=True))
    assert route(head.owners_silent()) is Route.PASS
    signed = Facts("GET", read=read(owners_ahead=True, authorize=True))
    assert route(signed.owners_silent()) is Route.AUTHORIZE


def test_every_way_is_some_row():
    """No way of the enum is left without a row that reaches it."""
    reached = {route(Facts(method, chunk=c, cut=cut, looped=lo, bypass=b, read=r))
               for method in ("GET", "HEAD", "POST")
               for c in (False, True) for cut in (False, True) for lo in (False, True) for b in (None, "why")
               for r in [None] + [read(authorize=a, fresh=f, only_if_cached=o, owners_ahead=w)
                                  for a in (False, True) for f in (False, True)
                                  for o in (False, True) for w in (False, True)]}
    assert reached == set(Route)
