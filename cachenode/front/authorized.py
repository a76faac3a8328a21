"""Reads of an `authorize` origin's objects (docs/private-objects.md): a
stored copy, or a fill in progress, reaches a caller only once the origin,
asked with that caller's own request, allows it the version held here.

What the probe is and what its answer means is `http/authorize.py`'s (pure);
this is the I/O: asking, then serving from disk, joining the fill, leading
one with the caller's request, or passing the origin's refusal on.

A caller's signed Range cannot be dropped, nor a whole object fetched
without the caller's credentials: a ranged read never leads or joins a
fill. Its miss goes to the origin as sent, and the part it brings is kept
towards the whole object (fill/assembly.py); once whole, the object's
ranges are served from disk like any stored object's.
"""

from __future__ import annotations

from typing import Callable

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from cachenode.counts import Counts
from cachenode.fill.flights import Flight, Kind, Outcome
from cachenode.fill.origin import forwarded_request_headers
from cachenode.fill.upstream import Upstream
from cachenode.front.access import parent_route
from cachenode.front.names import Asked
from cachenode.front.reads import AGAIN, GIVE_UP, Reads, arrived_whole
from cachenode.front.respond import Responder
from cachenode.front.short_answers import origin_failure
from cachenode.http.authorize import Verdict, asks_own_range, not_probeable, probe_fields, verdict
from cachenode.http.freshness import RequestDirectives
from cachenode.http.headers import first
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.config import Origin
from nezha.errors import OriginError
from nezha.keys import Target
from nezha.wire import CacheOutcome

log = structlog.get_logger("nezha.cachenode")


class AuthorizedReads:
    def __init__(self, *, store: Store, upstream: Upstream, reads: Reads, respond: Responder,
                 counts: Counts, from_peer: Callable[[web.Request], bool], node_id: str,
                 peers_have_a_token: bool) -> None:
        self.store = store
        self.upstream = upstream
        self.reads = reads  # the read loop, which this class is one way through
        self.engine = reads.engine
        self.respond = respond
        self.counts = counts
        self.from_peer = from_peer
        self.node_id = node_id
        self.peers_have_a_token = peers_have_a_token

    async def get(self, request: web.Request, asked: Asked, *, meta: Meta | None,
                  directives: RequestDirectives) -> web.StreamResponse:
        """A GET of an `authorize` origin's object (docs/private-objects.md):
        a stored copy is served only once the origin, asked with this
        caller's own request, says this caller may read this version; a miss
        asks the origin with the caller's request and stores what it answers."""
        if directives.no_store:
            # RFC 9111 §5.2.1.5: nothing of this exchange may be stored.
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS)
        if not_probeable(request.headers) is not None:
            # A pass origin's object stored while it said authorize, asked
            # with a field the probe would change: the origin answers it.
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.BYPASS)
        return await self.reads.loop(request, asked, directives, way=self, meta=meta)

    # -- the signed read's way through the read loop (front/reads.py) -------------
    attempts = 3
    fills_stale = False  # never stale-if-error: an origin that cannot be asked cannot allow a read
    drop: frozenset[str] = frozenset()  # asked as the caller asked, If-Match included: every field may be signed

    async def stored(self, request: web.Request, asked: Asked, meta: Meta | None,
                     directives: RequestDirectives) -> web.StreamResponse | None:
        if meta is None:
            return None
        # None: changed at the origin, or gone from the disk: fetched again, replacing it.
        return await self._serve(request, url=asked.url, meta=meta, directives=directives, target=asked.target,
                                 origin=asked.origin)

    async def before_flight(self, request: web.Request, asked: Asked,
                            directives: RequestDirectives) -> web.StreamResponse | None:
        if directives.only_if_cached:
            raise web.HTTPGatewayTimeout(text=f"{asked.key} is not cached on {self.node_id}\n")
        if "Range" in request.headers:
            return await self._part(request, url=asked.url, key=asked.key, target=asked.target, origin=asked.origin)
        return None

    async def led(self, request: web.Request, asked: Asked, outcome: Outcome,
                  response: aiohttp.ClientResponse | None, *, stale: Meta | None) -> web.StreamResponse | object:
        """A miss: the caller's own request went to the origin, and a storable
        answer is streamed to it while it is stored (or, stored at once, sent)."""
        if outcome.kind is Kind.STREAMING:
            assert outcome.fill is not None
            return await self.respond.fill(request, outcome.fill, label=CacheOutcome.MISS)
        if outcome.kind is Kind.STORED:
            # A small body that came whole, stored at once (fill/at_once.py
            # `store_whole`): the caller's own request fetched it.
            assert outcome.meta is not None
            served = await self.respond.hit(request, outcome.meta, label=CacheOutcome.MISS, body=outcome.body)
            return AGAIN if served is None else served
        if outcome.kind is Kind.PASSED:
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS, response=response)
        raise origin_failure(outcome.error)

    async def joined(self, request: web.Request, asked: Asked, flight: Flight, outcome: Outcome, *,
                     stale: Meta | None) -> web.StreamResponse | object:
        fill = outcome.fill
        if outcome.kind is Kind.STORED and outcome.answers(request.headers):
            # Stored at once before this request could join: a stored copy
            # like any other, read once authorised.
            await flight.landed.wait()
            return AGAIN
        if outcome.kind is not Kind.STREAMING or fill is None or not outcome.answers(request.headers):
            return GIVE_UP  # nothing to join, or a variant this request does not select
        if arrived_whole(fill):
            # Its whole body was in before this request came: once stored,
            # it is a stored copy like any other, read once authorised.
            await flight.landed.wait()
            return AGAIN
        # Joining: not a byte of the fill before the origin says this
        # caller may read the version it is filling.
        allowed, response = await self._authorize(request, asked.url, key=asked.key, etag=first(fill.headers, "ETag"))
        if allowed is Verdict.REFUSED:
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.DENIED, response=response)
        if allowed is Verdict.ALLOWED:
            return await self.respond.fill(request, fill, label=CacheOutcome.MISS_JOINED)
        return GIVE_UP

    async def give_up(self, request: web.Request, asked: Asked) -> web.StreamResponse:
        # The origin has another version than the one filling, or no fill
        # this caller could be allowed into: it asks the origin for itself.
        return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS)

    async def _serve(self, request: web.Request, *, url: str, meta: Meta, directives: RequestDirectives,
                     target: Target, origin: Origin) -> web.StreamResponse | None:
        """`meta` for this caller if the origin allows it, the origin's refusal
        if not; None: the origin has another version, or the copy vanished."""
        if self.peers_have_a_token and self.from_peer(request) and directives.only_if_cached:
            # A node copying the object (a replica, a hand-off), proven by the
            # cluster token: the bytes move between nodes, and every caller
            # they are later served to is authorised where they land. Without
            # a token any loopback client passes for a peer: no exception then.
            return await self.respond.hit(request, meta, label=CacheOutcome.HIT)
        allowed, response = await self._authorize(request, url, key=meta.key, etag=meta.etag)
        if allowed is Verdict.REFUSED:
            return await self.respond.passthrough(request, url, label=CacheOutcome.DENIED, response=response)
        if allowed is Verdict.CHANGED:
            if await self.store.remove_one(meta):  # the origin holds another version now
                self.counts.gone(meta, self.store.sizes())
            if response is not None:
                # The caller's own range, of the new version: its answer, and its first part.
                return await self._part(request, url=url, key=meta.key, target=target, origin=origin,
                                        response=response)
            return None
        self.counts.accessed(meta.key)
        return await self.respond.hit(request, meta, label=CacheOutcome.AUTHORIZED)

    async def _part(self, request: web.Request, *, url: str, key: str, target: Target, origin: Origin,
                    response: aiohttp.ClientResponse | None = None) -> web.StreamResponse:
        """A signed ranged read the disk cannot answer: the origin's answer
        to the caller's own request goes to the caller, and a 206 of it is
        kept as a part of the object (fill/assembly.py), `miss` then."""
        async def keep(answer: aiohttp.ClientResponse):
            return await self.engine.parts.keep(answer.status, answer.headers, request.headers, key=key, url=url,
                                                target=target, origin=origin)

        return await self.respond.passthrough(request, url, label=CacheOutcome.PASS, response=response,
                                              keep=keep)

    async def _authorize(self, request: web.Request, url: str, *, key: str,
                         etag: str | None) -> tuple[Verdict, aiohttp.ClientResponse | None]:
        """Ask the origin whether this caller may read the version `etag`
        names: the caller's request as sent, plus If-None-Match and Range:
        bytes=0-0 unless it sent a Range (http/authorize.py). The origin's
        answer is kept when it refused, and when it answered the caller's
        own Range with another version's bytes."""
        forwarded = forwarded_request_headers(request.headers, via=self.respond.via)
        fields = probe_fields(list(forwarded.items()), etag=etag)
        if fields is None:
            return Verdict.CHANGED, None  # stored before its origin said authorize: fetched again
        try:
            response = await self.upstream.request("GET", url, headers=CIMultiDict(fields), what=f"origin {url}",
                                                  route=parent_route(request))
        except OriginError as e:
            raise origin_failure(e)
        allowed = verdict(response.status)
        if allowed is Verdict.ALLOWED or (allowed is Verdict.CHANGED and not asks_own_range(forwarded.items())):
            response.release()
            return allowed, None
        if allowed is Verdict.CHANGED:
            return allowed, response
        log.info("read_refused", key=key, status=response.status)
        return allowed, response
