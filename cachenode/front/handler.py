"""The request handler: where each request that passes the middlewares
enters, once, and which answerer it goes down to.

Request path, in order: CONNECT and TRACE (405, a middleware); the node's
own endpoints, admin and internal (`front/routes.py`, one table); target
parsing (400); origin allow-list (403, the origin never contacted); then
`front/route.py` (pure) picks the way from facts about the request: a
chunk for a peer (cachenode/chunks/owner.py), a peer's question of why an
answer was cut (cachenode/peers/cuts.py), a loop (508), another method
(forwarded, `front/forward.py`), a bypass (credentials, never stored), and
once the store is looked up a hit, a relay to the key's owners
(`front/relaying.py`), a signed read (`front/authorized.py`), or the read
loop that joins or leads a flight (`front/reads.py`). What crosses and
what is stored: docs/http-semantics.md.

A response is either a single sendfile of a stored object, a stream from a
fill's growing temp file, or a pass-through copy of the origin's response
(`front/respond.py`). None of them holds a whole object in memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import aiohttp
import structlog
from aiohttp import web

from cachenode.chunks.owner import ChunkOwner
from cachenode.cluster.hot_copies import HotCheck, HotCopies
from cachenode.peers.auth import is_peer_request
from cachenode.peers.cuts import answer_cut
from cachenode.cluster_view import ClusterView
from cachenode.counts import Counts
from cachenode.fill.parent import looped
from cachenode.fill.upstream import Upstream
from cachenode.front.access import PARENT_ROUTE, access
from cachenode.front.authorized import AuthorizedReads
from cachenode.front.fast_misses import FastMisses, Led, take_led
from cachenode.front.forward import Forwarding
from cachenode.front.hits import PlainHitFinder, hit_label
from cachenode.front.interim import CONTINUE_DEFERRED, send_continue
from cachenode.front.middleware import REFUSED_METHODS
from cachenode.front.names import Asked, resolve
from cachenode.front.reads import AGAIN, UNSEEN, Reads
from cachenode.front.relaying import RelayedReads
from cachenode.front.respond import Responder
from cachenode.front.short_answers import origin_failure
from cachenode.front.route import Facts, Read, Route, route
from cachenode.front.routes import Routes
from cachenode.http.authorize import not_probeable
from cachenode.http.freshness import RequestDirectives, Use, request_bypasses_cache, request_directives
from cachenode.store.objects import Meta
from nezha.config import CacheSettings
from nezha.errors import OriginError
from nezha.keys import BadHost, BadTarget, credentials_kept
from nezha.ring import Peer
from nezha.wire import CHUNK_HEADER, CUT_HEADER, FROM_CHILD_HEADER, SCHEME_HEADER, CacheOutcome

log = structlog.get_logger("nezha.cachenode")


@dataclass
class _Look:
    """What looking up the store found for one read, and what routing it needs."""

    meta: Meta | None  # None also when a hot copy may not answer (it is revalidated or dropped)
    directives: RequestDirectives
    read: Read
    owners: list[Peer]
    ahead: list[Peer]
    revalidating: HotCheck | None


class Handler:
    def __init__(self, *, settings: CacheSettings, upstream: Upstream, cluster: ClusterView, routes: Routes,
                 plain: PlainHitFinder, hot: HotCopies, relayed: RelayedReads, reads: Reads,
                 authorized: AuthorizedReads, forwarding: Forwarding, respond: Responder, chunk_owner: ChunkOwner,
                 counts: Counts, clock: Callable[[], float] = time.time, misses: FastMisses | None = None) -> None:
        self.settings = settings
        self.node_id = settings.identity
        self.upstream = upstream
        self.cluster = cluster
        self.routes = routes  # the node's own endpoints: admin and internal
        self.plain = plain  # the fast path's questions (cachenode/front/fastpath.py)
        self.hot = hot  # hot copies' policy (cachenode/cluster/hot_copies.py)
        self.relayed = relayed
        self.reads = reads
        self.authorized = authorized
        self.forwarding = forwarding
        self.respond = respond
        # A chunk's owner serves (and fills) it for the peer reading its object (cachenode/chunks/).
        self.chunk_owner = chunk_owner
        self.counts = counts
        self.misses = misses  # plain cold misses the fast path leads (front/fast_misses.py); None: none
        self._table = settings.origin_table
        self._clock = clock

    # -- entry point -----------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        if (endpoint := self.routes.endpoint(request)) is not None:
            return await endpoint(request)
        asked = self._asked(request)
        if (led := take_led(request)) is not None and (served := await self._led(request, asked, led)) is not None:
            return served
        facts = Facts(method=request.method, chunk=CHUNK_HEADER in request.headers and self.from_peer(request),
                      cut=CUT_HEADER in request.headers and self.from_peer(request),
                      looped=looped(request.headers.getall("Via", []), self.respond.via,
                                    from_child=FROM_CHILD_HEADER in request.headers),
                      bypass=_bypass_reason(request, asked))
        way = route(facts)
        if way is Route.CHUNK:
            return await self._chunk(request, asked)
        if way is Route.CUT:
            return self._why_cut(request, asked)
        if way is Route.LOOP:
            return self._looped(request, asked)
        # Every origin request this one makes goes the same way: a child's
        # to its parent tier, a parent's (for a child) to the origin.
        if (parent := self.upstream.route_for(asked.target, request.headers)) is not None:
            request[PARENT_ROUTE] = parent
        if way is Route.FORWARD:
            return await self.forwarding.forward(request, asked)
        if way is Route.BYPASS:
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.BYPASS)
        look = await self._look(request, asked)
        way = route(facts := replace(facts, read=look.read))
        if way is Route.RELAY:
            answer = await self.relayed.read(request, asked, ahead=look.ahead, owners=look.owners,
                                             revalidating=look.revalidating, authorize=look.read.authorize)
            if answer is not None:
                return answer
            await self._owners_unreachable(request, asked, look.ahead)
            way = route(facts.owners_silent())
            look = replace(look, meta=None)  # the owners were asked meanwhile: look again
        return await self._answer(way, request, asked, look)

    async def _answer(self, way: Route, request: web.Request, asked: Asked, look: _Look) -> web.StreamResponse:
        """The answerer of `way` once the store was looked up (and the owners ahead, if any, were silent)."""
        if way is Route.UNCACHED:
            # A node this one's copy feeds (a stampede's tree of streaming copies) takes it as it arrives.
            if self.from_peer(request) and (copy := await self.relayed.for_peer(request, asked)) is not None:
                return copy
            raise web.HTTPGatewayTimeout(text=f"{asked.key} is not cached on {self.node_id}\n")
        if way is Route.HIT and request.method == "HEAD":
            assert look.meta is not None
            return await self.respond.hit(request, look.meta, label=hit_label(look.meta))
        if way is Route.PASS:
            return await self.respond.passthrough(request, asked.url, label=CacheOutcome.PASS)
        if way is Route.AUTHORIZE:
            return await self.authorized.get(request, asked, meta=look.meta, directives=look.directives)
        # The copy found is passed on: a second lookup would count this one read as two uses of it.
        return await self.reads.get(request, asked, look.directives, meta=UNSEEN if look.meta is None else look.meta)

    async def _led(self, request: web.Request, asked: Asked, led: Led) -> web.StreamResponse | None:
        """The answer of a flight the fast path led for this request
        (front/fast_misses.py), as the read loop answers the flight it leads;
        None: look again, as the read loop would."""
        served = await self.reads.led(request, asked, led.outcome, led.response, stale=None)
        return None if served is AGAIN else served

    def _asked(self, request: web.Request) -> Asked:
        """What the request names; 400 for a target that cannot be parsed, 403 for a host that is no origin."""
        host_header = request.headers.get("Host")
        try:
            target, origin, key = resolve(self._table, request.raw_path, host_header, scheme=self._scheme(request))
        except BadHost as e:
            raise web.HTTPForbidden(text=f"{e}: not a configured origin; this cache is not an open proxy\n")
        except BadTarget as e:
            raise web.HTTPBadRequest(text=f"bad request: {e}\n")
        access(request).host = target.host
        if origin is None or key is None:
            raise web.HTTPForbidden(
                text=f"host {target.host!r} is not a configured origin; this cache is not an open proxy\n")
        access(request).key = key
        return Asked(target=target, origin=origin, key=key, url=origin.url_of(target))

    async def _chunk(self, request: web.Request, asked: Asked) -> web.StreamResponse:
        """One chunk of a chunked object, for the peer reading it: this node owns that chunk."""
        try:
            return await self.chunk_owner.serve(request, access(request), key=asked.key, url=asked.url,
                                                target=asked.target)
        except OriginError as e:
            raise origin_failure(e)

    def _why_cut(self, request: web.Request, asked: Asked) -> web.Response:
        """A peer whose answer for the key broke off asks why: a fill of it here failed, or nothing was cut."""
        access(request).cache = "cut"
        return answer_cut(self.respond.cuts, asked.key)

    def _looped(self, request: web.Request, asked: Asked) -> web.Response:
        access(request).cache = CacheOutcome.REFUSED
        log.error("request_looped", host=asked.target.host, via=request.headers.getall("Via", [])[:3])
        return web.Response(status=508, reason="Loop Detected", text=(
            f"this request for {asked.target.host} already passed through {self.node_id}: the origin's name "
            f"resolves back to this node (an aliased host without a reachable upstream?)\n"))

    async def _look(self, request: web.Request, asked: Asked) -> _Look:
        """Look up what is stored for a GET or HEAD the cache may answer, and the facts routing it needs."""
        meta = self.reads.store.lookup(asked.key, request.headers)
        directives = request_directives(request.headers)
        # Stored while its origin said authorize: each read is still the
        # origin's to allow, whatever the table says now (a switch back to
        # pass, or this node running the old table mid-rollout).
        authorize = asked.origin.credentials == "authorize" or (meta is not None and meta.authorize)
        revalidating: HotCheck | None = None
        if meta is not None and meta.hot and self.reads.use(meta, directives) is not Use.FRESH:
            # A hot copy answers as fresh only while the owner's freshness it
            # carries lasts, and only requests a fresh copy may answer. Any
            # other is relayed with the copy's validators: the owner (never
            # this node) revalidates with the origin if it must, and its 304
            # renews the copy, served from here (front/relaying.py). A copy
            # that cannot be revalidated so is dropped once expired.
            revalidating = self.hot.check(meta, key=asked.key, request_headers=request.headers, signed=authorize,
                                          only_if_cached=directives.only_if_cached,
                                          from_peer=self.from_peer(request))
            if revalidating is None and not meta.fresh(self._clock()):
                await self.hot.drop(meta, why="expired")
            meta = None
        fresh = self._fresh(meta, directives, key=asked.key, authorize=authorize)
        # Only the first live owner fills from the origin. A replica that
        # misses asks the owners ahead of it, like a non-owner asks them all;
        # if none answers it is the first live owner and fills. A relayed
        # request (X-Nezha-Peer, from a peer) is never relayed again: at most one hop.
        owners = [] if self.from_peer(request) or fresh else self.cluster.owners(asked.key)
        ahead = _ahead_of(self.node_id, owners)
        return _Look(meta=meta, directives=directives, owners=owners, ahead=ahead, revalidating=revalidating,
                     read=Read(authorize=authorize, fresh=fresh, only_if_cached=directives.only_if_cached,
                               owners_ahead=bool(ahead)))

    def _fresh(self, meta: Meta | None, directives: RequestDirectives, *, key: str, authorize: bool) -> bool:
        """Does a copy here answer without waiting? A signed read's copy, whatever
        its age: every read is the origin's to allow, one here asked about here."""
        if authorize:
            return meta is not None
        use = self.reads.use(meta, directives)
        fresh = use is Use.FRESH or use is Use.STALE_WHILE_REVALIDATE
        if fresh:
            self.counts.accessed(key)
        return fresh

    async def _owners_unreachable(self, request: web.Request, asked: Asked, ahead: list[Peer]) -> None:
        log.warning("owners_unreachable", key=asked.key, owners=[p.id for p in ahead])
        held = self.reads.store.lookup(asked.key, request.headers)
        if held is not None and held.hot:
            # Served below as by any node whose owners are down, from
            # the origin: a hot copy is never revalidated there.
            await self.hot.drop(held, why="owners unreachable")

    async def expect(self, request: web.Request) -> None:
        """`Expect: 100-continue` (RFC 9110 §10.1.1): a request forwarded to an
        origin with its body gets the origin's own 100, or its early refusal
        (a 403, a redirect) before the body is sent; every other request is
        answered 100 at once, as aiohttp would."""
        if request.version == aiohttp.HttpVersion11 and request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"unknown expectation {request.headers.get('Expect')!r}\n")
        if request.method not in ("GET", "HEAD") and request.method not in REFUSED_METHODS:
            try:
                _, origin, _ = resolve(self._table, request.raw_path, request.headers.get("Host"))
            except BadTarget:
                origin = None
            if origin is not None:
                request[CONTINUE_DEFERRED] = True
                return
        if request.version == aiohttp.HttpVersion11:
            await send_continue(request)

    def _scheme(self, request: web.Request) -> str:
        """How the client reached the cluster: https on the TLS port (or relayed from it by a peer)."""
        if request.secure or getattr(request.protocol, "secure", False):  # the latter: TLS a follower worker ended
            return "https"
        if request.headers.get(SCHEME_HEADER) == "https" and self.from_peer(request):
            return "https"
        return "http"

    def from_peer(self, request: web.Request) -> bool:
        """A request another node of this cluster relayed (cachenode/peers/auth.py): X-Nezha-Peer with the
        cluster token. One from a client that merely says so asks the owners and is counted."""
        return is_peer_request(request, self.settings.cluster_token)

    async def invalidate(self, keys: list[str], *, why: str) -> None:
        """Forget `keys` here and on every other node that may hold them (front/forward.py)."""
        await self.forwarding.invalidate(keys, why=why)

    # -- the fast path's second question (cachenode/front/fastpath.py; `plain` answers the first) ---
    def fast_hit_done(self, meta: Meta, *, method: str, path: str, sent: int, ms: float,
                      gone: bool = False, first_byte: float | None = None, status: int = 200) -> None:
        """Count and log a fast-path hit exactly as the handler would, also when
        the client hung up mid-body (`gone`). A range (206) counts as a hit of its bytes, as there."""
        self.count_fast_hit(meta.host, meta.key, meta.hot, sent, first_byte)
        self.plain.log_fast_hit(meta, method=method, path=path, sent=sent, ms=ms, gone=gone, status=status)

    def count_fast_hit(self, host: str, key: str, hot: bool, sent: int, first_byte: float | None) -> None:
        """The counting half of a fast hit: also for hits another worker of this
        node served (cachenode/workers/), which the node's counters must include."""
        self.counts.plain_hit(host, key, sent, first_byte, hot=hot)


def _bypass_reason(request: web.Request, asked: Asked) -> str | None:
    """Why this GET or HEAD goes to the origin untouched, nothing of it
    stored or served from disk; None: the cache may answer it."""
    if asked.origin.credentials == "authorize":
        # Credentials are welcome (each read is authorised); a cookie stays
        # the client's own, and a request that sets a field the probe sets
        # cannot be made into one.
        if "Cookie" in request.headers:
            return "request carries Cookie"
        return not_probeable(request.headers)
    reason = request_bypasses_cache(request.headers)
    if reason is None and (kept := credentials_kept(asked.target, asked.origin)):
        reason = f"request URL carries credentials ({', '.join(kept)})"
    return reason


def _ahead_of(node_id: str, owners: list[Peer]) -> list[Peer]:
    """The owners to ask before serving a key here: all of them for a
    non-owner, those before this node in ring order for a replica, none for
    the first owner."""
    for i, p in enumerate(owners):
        if p.id == node_id:
            return owners[:i]
    return owners
