"""Which way a client's request for an origin goes. Pure: no I/O.

The handler (`front/handler.py`) gathers facts about a request, asks
`route` for the way, and calls the answerer of that way; so every branch of
the request path is a row in a unit test (tests/unit/cachenode/front/
test_route.py), as `fill/lead.py` is for a flight's leader.

Facts come in two steps, because looking up what is stored is a step of its
own (it moves the object up the store's LRU, and a hot copy's revalidation
is decided there): until `read` is known, a request that may be answered
from the cache routes to LOOK; the handler looks, and asks again. A relay
to owners that did not answer asks again too, with no owners ahead: the
request is then served here, as by the first owner.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Route(enum.Enum):
    CHUNK = "chunk"  # a peer asks this node, a chunk's owner, for one chunk (cachenode/chunks/owner.py)
    CUT = "cut"  # a peer asks why this node cut its answer for the key mid-body (cachenode/peers/cuts.py)
    LOOP = "loop"  # it passed through this node already: 508, never fetched again
    FORWARD = "forward"  # a method other than GET and HEAD: to the origin, body streamed; a success invalidates
    BYPASS = "bypass"  # to the origin untouched, nothing stored or served from disk (`Facts.bypass` says why)
    LOOK = "look"  # look up what is stored, then route again with `read`
    UNCACHED = "uncached"  # only-if-cached, and nothing here may answer: 504
    RELAY = "relay"  # ask the key's owners ahead of this node (at most one hop)
    HIT = "hit"  # a fresh copy here answers (a GET reads it through the read loop, which finds it at once)
    PASS = "pass"  # a HEAD that no fresh copy here answers (or a signed one): the origin's answer, not stored
    AUTHORIZE = "authorize"  # an `authorize` origin's read: the origin allows each one (front/authorized.py)
    FILL = "fill"  # the read loop: join a flight or lead one, or a copy stored meanwhile


@dataclass(frozen=True)
class Read:
    """What is known once the store was looked up."""

    authorize: bool  # the origin says authorize, or the stored copy was stored while it did
    fresh: bool  # a stored copy answers without waiting (fresh, stale-while-revalidate; any copy if authorize)
    only_if_cached: bool  # the request's Cache-Control says only-if-cached
    owners_ahead: bool  # owners to ask before this node (none for a peer's request, a fresh copy, the first owner)


@dataclass(frozen=True)
class Facts:
    method: str
    chunk: bool = False  # X-Nezha-Chunk on a GET or HEAD from a peer proven by the cluster token
    cut: bool = False  # X-Nezha-Cut from such a peer (with X-Nezha-Chunk, the chunk's owner answers it)
    looped: bool = False  # its Via names this node (fill/parent.py, `looped`)
    bypass: str | None = None  # why it may not be answered from the cache; None: it may
    read: Read | None = None  # None: not looked up yet

    def owners_silent(self) -> Facts:
        """These facts once the owners ahead did not answer a relay."""
        assert self.read is not None
        return replace(self, read=replace(self.read, owners_ahead=False))


def route(facts: Facts) -> Route:
    """The way for a request with `facts`; rows in the order they win."""
    f = facts
    safe = f.method in ("GET", "HEAD")
    if f.chunk and safe:
        return Route.CHUNK
    if f.cut and f.method == "GET":
        return Route.CUT
    if f.looped:
        return Route.LOOP
    if not safe:
        return Route.FORWARD
    if f.bypass is not None:
        return Route.BYPASS
    if f.read is None:
        return Route.LOOK
    r = f.read
    if r.only_if_cached and not r.fresh:
        return Route.UNCACHED
    if r.owners_ahead:
        return Route.RELAY
    if f.method == "HEAD":
        return Route.HIT if r.fresh and not r.authorize else Route.PASS
    if r.authorize:
        return Route.AUTHORIZE
    return Route.HIT if r.fresh else Route.FILL
