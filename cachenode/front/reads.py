"""A read served here: a stored copy, joining a flight or leading one
(docs/cache-node.md, "Single flight"). The handler comes here once
`front/route.py` says the read is this node's (a hit or a fill).

One loop for every read, plain and signed (`loop`): a signed read's way
(front/authorized.py) adds its probe before a copy or a fill reaches its
caller. A joiner whose leader vanished, or whose copy vanished between
lookup and open, looks again: the loop is bounded, so a pathological
origin cannot keep a request looping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol

import aiohttp
import structlog
from aiohttp import web

from cachenode.peers.auth import is_peer_request
from cachenode.counts import Counts
from cachenode.fill.buffer import Fill
from cachenode.fill.engine import NOT_FOR_FILLS, FillEngine, LeaderGone
from cachenode.fill.flights import Flight, Kind, Outcome
from cachenode.front.access import parent_route
from cachenode.front.hits import hit_label
from cachenode.front.interim import InterimRelay
from cachenode.front.names import Asked
from cachenode.front.respond import Responder
from cachenode.front.short_answers import origin_failure
from cachenode.http.freshness import RequestDirectives, Use, judge, may_serve_stale_on_error
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.wire import DIGEST_HEADER, CacheOutcome

log = structlog.get_logger("nezha.cachenode")

AGAIN = object()  # look again: the loop's next turn
GIVE_UP = object()  # leave the loop: the way's last answer (`give_up`)
UNSEEN = object()  # nothing looked up yet
Step = web.StreamResponse | object  # an answer, AGAIN or GIVE_UP


def arrived_whole(fill: Fill) -> bool:
    """Every byte of the fill's body is in, so a request that finds it now is
    a later request, not a joiner. `complete` alone says so one step late for
    a body of known length: a client of the fill has its last byte (and may
    ask again) as soon as that byte is in, while `complete` waits for the
    origin's body to end. A request in between joined the fill, and a
    client's second read of an object it had whole counted as a miss."""
    return fill.complete or (fill.length is not None and fill.written >= fill.length)


class Way(Protocol):
    """What each step of the read loop does for one kind of read (plain: `Reads`; signed: AuthorizedReads).
    Each step returns an answer, AGAIN, GIVE_UP, or None: on to the next step."""

    attempts: int
    fills_stale: bool  # a flight it leads is given the stored copy as stale (to revalidate, or serve on error)
    drop: frozenset[str]  # the client's fields the origin is not sent when it leads

    async def stored(self, request: web.Request, asked: Asked, meta: Meta | None,
                     directives: RequestDirectives) -> Step | None: ...

    async def before_flight(self, request: web.Request, asked: Asked,
                            directives: RequestDirectives) -> Step | None: ...

    async def led(self, request: web.Request, asked: Asked, outcome: Outcome,
                  response: aiohttp.ClientResponse | None, *, stale: Meta | None) -> Step: ...

    async def joined(self, request: web.Request, asked: Asked, flight: Flight, outcome: Outcome, *,
                     stale: Meta | None) -> Step: ...

    async def give_up(self, request: web.Request, asked: Asked) -> web.StreamResponse: ...


class Reads:
    def __init__(self, *, store: Store, engine: FillEngine, respond: Responder, counts: Counts,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.engine = engine
        self.respond = respond
        self.counts = counts
        self._clock = clock

    def use(self, meta: Meta | None, directives: RequestDirectives) -> Use | None:
        """How a stored response may answer this request (RFC 9111 §4, RFC 5861); None: nothing stored."""
        if meta is None:
            return None
        return judge(now=self._clock(), stored_at=meta.stored_at, expires_at=meta.expires_at, initial_age=meta.age,
                     stale_if_error=meta.stale_if_error, stale_while_revalidate=meta.stale_while_revalidate,
                     request=directives)

    async def get(self, request: web.Request, asked: Asked, directives: RequestDirectives, *,
                  meta: Meta | None | object = UNSEEN) -> web.StreamResponse:
        """A plain read: a fresh copy, else a flight (joined or led). `meta`: the
        copy the handler found, passed on so the store counts one read as one use."""
        return await self.loop(request, asked, directives, way=self, meta=meta)

    async def loop(self, request: web.Request, asked: Asked, directives: RequestDirectives, *, way: Way,
                   meta: Meta | None | object = UNSEEN) -> web.StreamResponse:
        """The read loop of every read, plain and signed: what is stored, then
        the flight, until one answers; `way` says what each step does (a signed
        read asks the origin before a stored copy or a fill reaches its caller,
        front/authorized.py). `meta`: the copy the handler looked up already."""
        for attempt in range(way.attempts):
            if attempt or meta is UNSEEN:
                meta = self.store.lookup(asked.key, request.headers)
            assert meta is None or isinstance(meta, Meta)
            answer = await way.stored(request, asked, meta, directives)
            if answer is None:
                answer = await way.before_flight(request, asked, directives)
            if answer is None:
                answer = await self._flight(request, asked, way, meta)
            if answer is GIVE_UP:
                break
            if answer is not AGAIN:
                assert isinstance(answer, web.StreamResponse)
                return answer
        return await way.give_up(request, asked)

    async def _flight(self, request: web.Request, asked: Asked, way: Way, meta: Meta | None) -> Step:
        flight, leader = self.engine.flights.lead_or_join(asked.key)
        if leader:
            outcome, response = await self.lead(request, flight, asked, stale=meta if way.fills_stale else None,
                                                drop=way.drop)
            return await way.led(request, asked, outcome, response, stale=meta)
        outcome = await asyncio.shield(flight.outcome)
        return await way.joined(request, asked, flight, outcome, stale=meta)

    # -- the plain read's way -------------------------------------------------------
    attempts = 5  # a joiner whose leader vanished retries; bounded
    fills_stale = True  # a stale copy is revalidated by the flight, and may answer an origin's error
    drop = NOT_FOR_FILLS

    async def stored(self, request: web.Request, asked: Asked, meta: Meta | None,
                     directives: RequestDirectives) -> Step | None:
        use = self.use(meta, directives)
        if use is Use.FRESH or use is Use.STALE_WHILE_REVALIDATE:
            assert meta is not None
            served = await self._stored(request, asked, meta, use)
            return AGAIN if served is None else served  # evicted or replaced between lookup and open, or lost
        return None

    async def before_flight(self, request: web.Request, asked: Asked,
                            directives: RequestDirectives) -> Step | None:
        if directives.no_store:
            # RFC 9111 §5.2.1.5: nothing of this exchange may be stored.
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS)
        return None

    async def led(self, request: web.Request, asked: Asked, outcome: Outcome,
                  response: aiohttp.ClientResponse | None, *, stale: Meta | None) -> Step:
        served = await self._answer(request, asked, outcome, leader=True, response=response, stale=stale)
        return AGAIN if served is None else served

    async def joined(self, request: web.Request, asked: Asked, flight: Flight, outcome: Outcome, *,
                     stale: Meta | None) -> Step:
        joined = await self._joined(request, flight, outcome, asked)
        if joined is not None:
            return joined
        served = await self._answer(request, asked, outcome, leader=False, response=None, stale=stale)
        return AGAIN if served is None else served

    async def give_up(self, request: web.Request, asked: Asked) -> web.StreamResponse:
        raise web.HTTPServiceUnavailable(text=f"gave up on {asked.key}: the origin exchange kept restarting\n")

    async def _stored(self, request: web.Request, asked: Asked, meta: Meta, use: Use) -> web.StreamResponse | None:
        """A fresh (or stale-while-revalidate) copy served; None: it vanished (a lost one is forgotten)."""
        if use is Use.STALE_WHILE_REVALIDATE:
            self.engine.revalidate_soon(key=asked.key, url=asked.url, origin=asked.origin, stale=meta,
                                        target=asked.target,
                                        source=self.engine.origin_source(asked.url, request.headers,
                                                                         route=parent_route(request)))
        served = await self.respond.hit(request, meta, label=hit_label(meta) if use is Use.FRESH
                                        else CacheOutcome.STALE)
        if served is None and self.store.lookup(asked.key) is meta:
            await self._forget_lost(meta)
        return served

    async def lead(self, request: web.Request, flight: Flight, asked: Asked, *, stale: Meta | None,
                   drop: frozenset[str] = NOT_FOR_FILLS) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        """Lead `flight`: the origin asked once for every reader of the key, its
        interim answers relayed to this client. `drop`: the client's fields
        the origin is not sent (a fill's: validators and Range; a signed read
        drops none, every field may be signed)."""
        interim = InterimRelay(request)
        # A relay resuming a body hands on the digest of the head it began with (nezha/wire.py DIGEST_HEADER).
        peer = is_peer_request(request, self.respond.settings.cluster_token)
        handed = request.headers.get(DIGEST_HEADER) if peer else None
        reads = request.method == "GET" and not peer  # a peer's read of a chunked object is answered its manifest
        source = self.engine.origin_source(asked.url, request.headers, route=parent_route(request), drop=drop,
                                           interim=interim, handed=handed)
        try:
            return await self.engine.lead(flight, key=asked.key, url=asked.url, origin=asked.origin, stale=stale,
                                          target=asked.target, source=source._replace(read_here=reads))
        finally:
            interim.close()

    async def _joined(self, request: web.Request, flight: Flight, outcome: Outcome,
                      asked: Asked) -> Step | None:
        """A joiner's look at its leader's outcome: AGAIN, a pass-through, or None (it is this request's)."""
        if outcome.kind is Kind.STREAMING and outcome.fill is not None and arrived_whole(outcome.fill):
            # The fill's whole response was in before this request came:
            # it is no joiner, but a later request, judged by the stored
            # object's freshness (a no-cache object is revalidated).
            await flight.landed.wait()  # stored (or failed) by then
            return AGAIN
        if not outcome.answers(request.headers):
            # The leader's response varies on a field this request sets
            # otherwise (RFC 9111 §4.1): it is not this request's answer.
            if outcome.kind is Kind.STREAMING:
                return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS)
            return AGAIN
        return None

    async def _answer(self, request: web.Request, asked: Asked, outcome: Outcome, *, leader: bool,
                      response: aiohttp.ClientResponse | None, stale: Meta | None) -> web.StreamResponse | None:
        """The flight's outcome as this request's answer; None: look again."""
        if outcome.kind is Kind.STREAMING:
            assert outcome.fill is not None
            return await self.respond.fill(request, outcome.fill,
                                           label=CacheOutcome.MISS if leader else CacheOutcome.MISS_JOINED)
        if outcome.kind is Kind.REVALIDATED or outcome.kind is Kind.STORED:
            assert outcome.meta is not None
            label = (CacheOutcome.REVALIDATED if outcome.kind is Kind.REVALIDATED
                     else CacheOutcome.MISS if leader else CacheOutcome.MISS_JOINED)
            return await self.respond.hit(request, outcome.meta, label=label, body=outcome.body)
        if outcome.kind is Kind.PASSED:
            if response is not None and any(name in request.headers for name in NOT_FOR_FILLS):
                # The fill's request left out this client's Range and
                # validators; a response that is not stored is this
                # client's alone, so it asks again, as it asked.
                response.release()
                response = None
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS, response=response)
        error = outcome.error
        if isinstance(error, LeaderGone):
            return None
        if stale is not None and may_serve_stale_on_error(now=self._clock(), expires_at=stale.expires_at,
                                                          stale_if_error=stale.stale_if_error):
            log.warning("serving_stale", key=asked.key, error=str(error))
            served = await self.respond.hit(request, stale, label=CacheOutcome.STALE, stale_reason=str(error))
            if served is not None:
                return served
        raise origin_failure(error)

    async def _forget_lost(self, meta: Meta) -> None:
        """A stored object whose data file is gone although the index still has
        it (not evicted, not replaced: removed behind the node's back, or a
        disk fault). Forget it, so the request refetches instead of failing."""
        log.warning("object_file_missing", key=meta.key, data=meta.data)
        if await self.store.remove_one(meta):
            self.counts.gone(meta, self.store.sizes())
