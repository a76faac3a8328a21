"""The request handler: what each request that passes the middlewares is
answered with, and by which room.

Request path, in order: CONNECT and TRACE (405, a middleware); admin
endpoints; internal endpoints (hand-off, invalidation); target parsing
(400); origin allow-list (403, the origin never contacted); methods other
than GET and HEAD (forwarded, body streamed; a success invalidates);
credentials (pass through, never stored); then a hit, a relay to the key's
owners, joining a flight, or leading one (the fill engine). What crosses
and what is stored: docs/http-semantics.md.

A response is either a single sendfile of a stored object, a stream from a
fill's growing temp file, or a pass-through copy of the origin's response
(`front/respond.py`). None of them holds a whole object in memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable
from urllib.parse import urljoin, urlsplit

import aiohttp
import structlog
from aiohttp import web

from cachenode.cluster.handoff import Handoff
from cachenode.cluster.hot_revalidation import conditional_fields, confirms, owner_expiry
from cachenode.cluster.hotness import HotReads
from cachenode.cluster.invalidation import Invalidation
from cachenode.cluster.peer_auth import is_peer_request
from cachenode.cluster.view import ClusterView
from cachenode.chunks.owner import ChunkOwner
from cachenode.counts import Counts
from cachenode.fill.engine import NOT_FOR_FILLS, FillEngine, LeaderGone
from cachenode.fill.flights import Kind
from cachenode.fill.parent import looped
from cachenode.fill.upstream import Upstream
from cachenode.front.access import PARENT_ROUTE, access, parent_route
from cachenode.front.authorized import AuthorizedReads
from cachenode.front.fastpath import response_head
from cachenode.front.middleware import REFUSED_METHODS, SAFE_METHODS
from cachenode.front.relay import PeerRelay
from cachenode.front.interim import InterimRelay
from cachenode.front.respond import CONTINUE_DEFERRED, Responder, origin_failure, send_continue
from cachenode.http.authorize import not_probeable
from cachenode.http.freshness import (RequestDirectives, Use, current_age, judge, may_serve_stale_on_error,
                                      request_bypasses_cache, request_directives)
from cachenode.http.headers import renewed_by_304, stored_pairs
from cachenode.http.vary import selecting_headers, vary_names
from cachenode.http.vary import variant as variant_of
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.chunks import Manifest
from nezha.config import CacheSettings, Origin
from nezha.credentials import redact_url
from nezha.errors import OriginError
from nezha.keys import BadHost, BadTarget, Target, credentials_kept, host_of, key_for, parse_target
from nezha.ring import Peer
from nezha.wire import (ADMIN_PATHS, CACHE_HEADER, CHUNK_HEADER, CHUNKED_HEADER, EXPIRES_HEADER, FROM_CHILD_HEADER, INTERNAL_PREFIX,
                        SCHEME_HEADER, CacheOutcome, relayed)

log = structlog.get_logger("nezha.cachenode")


class Handler:
    def __init__(self, *, settings: CacheSettings, store: Store, origins: Upstream, cluster: ClusterView,
                 relay: PeerRelay, respond: Responder, engine: FillEngine, handoff: Handoff, invalidation: Invalidation,
                 chunk_owner: ChunkOwner, counts: Counts, metrics: Metrics, status: Callable[[], dict],
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.node_id = settings.identity
        self.store = store
        self.upstream = origins
        self.cluster = cluster
        self.relay = relay
        self.respond = respond
        self.engine = engine
        self.handoff = handoff
        self.invalidation = invalidation
        self.counts = counts
        self.metrics = metrics
        self.status = status  # the node's /readyz answer; "ready" says whether it serves
        # Awaited before /metrics is rendered: with --workers, until the followers'
        # hits answered so far are counted here (cachenode/workers/primary.py).
        self.before_metrics: Callable[[], Awaitable[None]] | None = None
        self._table = settings.origin_table
        self._clock = clock
        # The log level is set once, before a node is made (nezha.logs.configure):
        # below info, a plain hit skips building its request_completed line.
        self._log_hits = log.is_enabled_for(logging.INFO)
        # The fast path's memo: request line and Host -> key, key -> (meta, head, path).
        self._plain_keys: dict[tuple[str, str, str], str] = {}
        self._plain_heads: dict[str, tuple[Meta, bytes, str]] = {}
        # Hot copies (docs/cache-node.md): relayed reads counted per key; keys being copied now.
        self.hot = HotReads(reads=settings.hot_reads, window=settings.hot_window)
        self._hot_copying: set[str] = set()
        # A chunk's owner serves (and fills) it for the peer reading its object (cachenode/chunks/).
        self.chunk_owner = chunk_owner
        self.authorized = AuthorizedReads(store=store, origins=origins, engine=engine, respond=respond,
                                          counts=counts, from_peer=self.from_peer, node_id=self.node_id,
                                          peers_have_a_token=settings.cluster_token is not None)

    # -- entry point -----------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        host_header = request.headers.get("Host")
        if not self._names_origin(host_header):
            if request.raw_path in ADMIN_PATHS:
                return await self._admin(request)
            if request.raw_path.startswith(INTERNAL_PREFIX):
                access(request).cache = "internal"
                if request.raw_path.split("?", 1)[0] == Invalidation.PATH:
                    return await self.invalidation.handle(request)
                return await self.handoff.handle(request)
        try:
            target, origin, key = self._resolve(request.raw_path, host_header, scheme=self._scheme(request))
        except BadHost as e:
            raise web.HTTPForbidden(text=f"{e}: not a configured origin; this cache is not an open proxy\n")
        except BadTarget as e:
            raise web.HTTPBadRequest(text=f"bad request: {e}\n")
        access(request).host = target.host
        if origin is None or key is None:
            raise web.HTTPForbidden(
                text=f"host {target.host!r} is not a configured origin; this cache is not an open proxy\n")
        url = origin.upstream_for(target.scheme, target.host) + target.path_qs
        access(request).key = key
        if CHUNK_HEADER in request.headers and request.method in ("GET", "HEAD") and self.from_peer(request):
            # One chunk of a chunked object, for the peer reading it: this node owns that chunk.
            try:
                return await self.chunk_owner.serve(request, access(request), key=key, url=url, target=target)
            except OriginError as e:
                raise origin_failure(e)
        if looped(request.headers.getall("Via", []), self.respond.via,
                  from_child=FROM_CHILD_HEADER in request.headers):
            access(request).cache = CacheOutcome.REFUSED
            log.error("request_looped", host=target.host, via=request.headers.getall("Via", [])[:3])
            return web.Response(status=508, reason="Loop Detected", text=(
                f"this request for {target.host} already passed through {self.node_id}: the origin's name "
                f"resolves back to this node (an aliased host without a reachable upstream?)\n"))
        # Every origin request this one makes goes the same way: a child's
        # to its parent tier, a parent's (for a child) to the origin.
        if (route := self.upstream.route_for(target, request.headers)) is not None:
            request[PARENT_ROUTE] = route
        if request.method not in ("GET", "HEAD"):
            return await self._forward(request, url=url, key=key, target=target)
        authorize = origin.credentials == "authorize"
        bypass = _bypass_reason(request, target, origin, authorize=authorize)
        if bypass is not None:
            return await self.respond.passthrough(request, url, label=CacheOutcome.BYPASS)
        meta = self.store.lookup(key, request.headers)
        directives = request_directives(request.headers)
        # Stored while its origin said authorize: each read is still the
        # origin's to allow, whatever the table says now (a switch back to
        # pass, or this node running the old table mid-rollout).
        authorize = authorize or (meta is not None and meta.authorize)
        revalidating: _HotCheck | None = None
        if meta is not None and meta.hot and self._use(meta, directives) is not Use.FRESH:
            # A hot copy answers as fresh only while the owner's freshness it
            # carries lasts, and only requests a fresh copy may answer. Any
            # other is relayed with the copy's validators: the owner (never
            # this node) revalidates with the origin if it must, and its 304
            # renews the copy, served from here (_hot_answer). A copy that
            # cannot be revalidated so is dropped once expired.
            revalidating = self._hot_check(request, meta, key=key, authorize=authorize, directives=directives)
            if revalidating is None and not meta.fresh(self._clock()):
                await self._drop_hot(meta, why="expired")
            meta = None
        if authorize:
            # Every read is the origin's to allow, however fresh the copy:
            # one here is asked about here, one elsewhere at its owner.
            fresh = meta is not None
        else:
            use = self._use(meta, directives)
            fresh = use is Use.FRESH or use is Use.STALE_WHILE_REVALIDATE  # served from here without waiting
            if fresh:
                self.counts.accessed(key)
        if directives.only_if_cached and not fresh:
            raise web.HTTPGatewayTimeout(text=f"{key} is not cached on {self.node_id}\n")
        # Only the first live owner fills from the origin. A replica that
        # misses asks the owners ahead of it, like a non-owner asks them all;
        # if none answers it is the first live owner and fills. A relayed
        # request (X-Nezha-Peer, from a peer) is never relayed again: at most one hop.
        owners = [] if self.from_peer(request) or fresh else self.cluster.owners(key)
        ahead = _ahead_of(self.node_id, owners)
        if ahead:
            on_answer = None
            if revalidating is not None:
                on_answer = self._hot_answer(revalidating, ahead=ahead, target=target, url=url, origin=origin)
            relayed = await self.relay.relay(request, ahead, target=target, origin_url=url,
                                             on_manifest=self._chunked_from_peer,
                                             validators=revalidating.fields if revalidating else None,
                                             on_answer=on_answer)
            if revalidating is not None and revalidating.served:
                return relayed  # from this node's renewed copy, counted as the hit it is
            if relayed is not None:
                record = access(request)
                outcome = _RELAY_OUTCOME.get(record.cache or "")
                self.counts.count(target.host, metrics=False, bytes_served=record.bytes,
                            **({outcome: 1} if outcome else {}))
                if len(ahead) < len(owners) and request.method == "GET":
                    self._keep_copy(record, ahead, target)
                elif request.method == "GET" and not authorize:
                    # A copy the owner's answer replaced is copied again at once:
                    # the key was hot, and its readers keep coming here.
                    self._count_hot_read(record, ahead, target, key=key, response=relayed, request=request,
                                         at_once=revalidating is not None and revalidating.replaced)
                return relayed
            log.warning("owners_unreachable", key=key, owners=[p.id for p in ahead])
            held = self.store.lookup(key, request.headers)
            if held is not None and held.hot:
                # Served below as by any node whose owners are down, from
                # the origin: a hot copy is never revalidated there.
                await self._drop_hot(held, why="owners unreachable")
        if request.method == "HEAD":
            if fresh and not authorize:
                return await self.respond.hit(request, meta, label=_hit_label(meta))
            return await self.respond.passthrough(request, url, label=CacheOutcome.PASS)
        if authorize:
            return await self.authorized.get(request, key=key, url=url, origin=origin, target=target, meta=meta,
                                             directives=directives)
        return await self._get(request, key=key, url=url, origin=origin, target=target, directives=directives)

    def _use(self, meta: Meta | None, directives: RequestDirectives) -> Use | None:
        """How a stored response may answer this request (RFC 9111 §4, RFC 5861); None: nothing stored."""
        if meta is None:
            return None
        return judge(now=self._clock(), stored_at=meta.stored_at, expires_at=meta.expires_at, initial_age=meta.age,
                     stale_if_error=meta.stale_if_error, stale_while_revalidate=meta.stale_while_revalidate,
                     request=directives)

    async def expect(self, request: web.Request) -> None:
        """`Expect: 100-continue` (RFC 9110 §10.1.1): a request forwarded to an
        origin with its body gets the origin's own 100, or its early refusal
        (a 403, a redirect) before the body is sent; every other request is
        answered 100 at once, as aiohttp would."""
        if request.version == aiohttp.HttpVersion11 and request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"unknown expectation {request.headers.get('Expect')!r}\n")
        if request.method not in ("GET", "HEAD") and request.method not in REFUSED_METHODS:
            try:
                _, origin, _ = self._resolve(request.raw_path, request.headers.get("Host"))
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

    def _resolve(self, raw_target: str, host_header: str | None,
                 scheme: str = "http") -> tuple[Target, Origin | None, str | None]:
        """What a request names: its target, the origin configured for its host
        (None: refused) and its cache key. Raises BadTarget. One place, so the
        handler and the fast path can never disagree about a request."""
        target = parse_target(raw_target, host_header, scheme=scheme)
        origin = self._table.get(target.host)  # an absolute URI's host wins over Host:
        if origin is None:
            return target, None, None
        return target, origin, key_for(target, origin)

    # -- the fast path's two questions (cachenode/front/fastpath.py) -------------------
    def plain_hit(self, raw_target: str, host_header: str, scheme: str = "http") -> tuple[Meta, bytes, str] | None:
        """The fresh stored object a plain GET/HEAD asks for, with its response
        head and data path, if this node serves it itself as `handle()` would (a
        fresh local copy is served whoever owns the key). None sends the request
        through the full handler. `scheme`: https for a connection whose TLS
        this process ended (a follower worker's, cachenode/workers/)."""
        key = self._plain_keys.get((scheme, raw_target, host_header))
        if key is None:
            if not self._names_origin(host_header):
                return None
            try:
                _, origin, key = self._resolve(raw_target, host_header, scheme=scheme)
            except BadTarget:
                return None
            if key is None or origin is None or origin.credentials == "authorize":
                return None  # an authorize origin's reads are each the origin's to allow: never a plain hit
            if len(self._plain_keys) >= _PLAIN_CACHE:
                self._plain_keys.clear()
            self._plain_keys[(scheme, raw_target, host_header)] = key
        meta = self.store.lookup(key)
        if meta is None or meta.status != 200 or meta.authorize or meta.chunk_size or not meta.fresh(self._clock()):
            return None  # a chunked object is read from its chunks' owners, not sent from one file
        prepared = self._plain_heads.get(key)
        if prepared is None or prepared[0] is not meta:
            if len(self._plain_heads) >= _PLAIN_CACHE:
                self._plain_heads.clear()
            prepared = self._plain_heads[key] = (meta, response_head(meta, via=self.respond.via,
                                                                      served_by=self.node_id),
                                                        self.store.data_path(meta))
        return prepared

    def fast_hit_done(self, meta: Meta, *, method: str, path: str, sent: int, ms: float,
                      gone: bool = False, first_byte: float | None = None, status: int = 200) -> None:
        """Count and log a fast-path hit exactly as the handler would, also when
        the client hung up mid-body (`gone`). A range (206) counts as a hit of its bytes, as there."""
        self.count_fast_hit(meta.host, meta.key, meta.hot, sent, first_byte)
        self.log_fast_hit(meta, method=method, path=path, sent=sent, ms=ms, gone=gone, status=status)

    def count_fast_hit(self, host: str, key: str, hot: bool, sent: int, first_byte: float | None) -> None:
        """The counting half of a fast hit: also for hits another worker of this
        node served (cachenode/workers/), which the node's counters must include."""
        self.counts.plain_hit(host, key, sent, first_byte, hot=hot)

    def log_fast_hit(self, meta: Meta, *, method: str, path: str, sent: int, ms: float, gone: bool = False,
                     status: int = 200) -> None:
        """The access log half of a fast hit: one line, written by the worker that served it."""
        if not self._log_hits:
            return  # below the log level: not even the fields are worth making
        if gone:
            log.info("client_gone", key=meta.key, bytes=sent)
        log.info("request_completed", method=method, host=meta.host, path=redact_url(path)[:300], status=status,
                 cache=_hit_label(meta), bytes=sent, ms=round(ms, 2), fast=True, **({"broken": True} if gone else {}))

    def _keep_copy(self, record, ahead: list[Peer], target: Target) -> None:
        """A replica that relayed an owner's hit copies the object, so it holds
        its replica from now on. After a miss there is nothing to do: the
        owner's fill pushes the copy here when it completes."""
        if record.broken or record.cache not in (relayed(CacheOutcome.HIT), relayed(CacheOutcome.REVALIDATED)):
            return
        peer = next((p for p in ahead if p.id == record.peer), None)
        if peer is not None:
            self.handoff.copy_soon(peer, target)

    def _count_hot_read(self, record, ahead: list[Peer], target: Target, *, key: str,
                        response: web.StreamResponse, request: web.Request, at_once: bool = False) -> None:
        """A non-owner relayed a read of `key`: count it, and once the key is
        hot (HotReads) and an owner answered from its disk, copy the object
        from that owner as a hot copy. Never from the origin: a copy is
        `only-if-cached` at the owner, so a miss there copies nothing.
        `at_once`: the owner's answer replaced this node's hot copy, so the
        key is hot already and is copied again without counting.

        An answer that varies is counted and copied per variant: the copy
        holds the one variant the reads select (asked of the owner with the
        fields that select it, as a replica is), and a key read often in one
        variant and once in another should copy the first, not whichever
        variant happened to make the count. Not copied: a variant that cannot
        be spelled as request fields, and an object that cannot fit the hot
        share (it would be fetched whole from the owner only to be dropped).
        """
        if not self.hot.enabled or record.broken:
            return
        names = vary_names(response.headers)
        if names is None:
            return  # a Vary no request could match: never stored anywhere
        chosen = variant_of(names, request.headers) if names else ""
        selecting = selecting_headers(names, chosen)
        counted = f"{key}\n{chosen}" if names else key  # HotReads counts per variant
        if not at_once and not self.hot.seen(counted, self._clock()):
            return
        if record.cache not in (relayed(CacheOutcome.HIT), relayed(CacheOutcome.REVALIDATED)):
            return
        if counted in self._hot_copying or selecting is None:
            return
        size = _object_size(response)
        limit = self.settings.hot_capacity
        if size is None or (limit is not None and size > limit) or not self.store.fits(size):
            return
        peer = next((p for p in ahead if p.id == record.peer), None)
        if peer is None:
            return
        self._hot_copying.add(counted)

        def done() -> None:
            self._hot_copying.discard(counted)
            self.hot.forget(counted)  # a failed copy is tried again only after as many reads again

        self.handoff.copy_hot_soon(peer, target, headers=selecting, done=done)

    def _hot_check(self, request: web.Request, meta: Meta, *, key: str, authorize: bool,
                   directives: RequestDirectives) -> _HotCheck | None:
        """How to revalidate the hot copy `meta` with its owner for this
        request (cluster/hot_revalidation.py); None when it is not: a peer's
        request, a signed read, `only-if-cached`, a node that owns the key
        now (a ring change), a chunked object's manifest (its owner answers
        a peer with the manifest, never a 304), or a copy with no validator
        this request allows."""
        if authorize or directives.only_if_cached or self.from_peer(request) or meta.chunk_size:
            return None
        if any(p.id == self.node_id for p in self.cluster.owners(key)):
            return None
        fields = conditional_fields(etag=meta.etag, last_modified=meta.last_modified,
                                    client_if_none_match=request.headers.get("If-None-Match"))
        if fields is None:
            return None
        return _HotCheck(meta=meta, fields=fields, client_if_none_match=request.headers.get("If-None-Match"))

    def _hot_answer(self, check: _HotCheck, *, ahead: list[Peer], target: Target, url: str, origin: Origin):
        """The relay's look at the owner's answer to a hot copy's revalidation.

        A 304 about the copy's version: renew the copy with the owner's
        expiry and serve the client from this node's disk (`hot-hit`, its
        own conditionals and Range judged against the copy). Any other
        answer is relayed as it is, and one that says the owner's version is
        not the copy's (a 2xx, a 304 about the client's version, a 404) drops
        the copy first, so no reader here gets the old bytes after it."""
        async def on_answer(request: web.Request, answer: aiohttp.ClientResponse,
                            peer: Peer) -> web.StreamResponse | None:
            meta = check.meta
            if answer.status == 304 and confirms(etag=meta.etag, answer_etag=answer.headers.get("ETag"),
                                                 client_if_none_match=check.client_if_none_match):
                renewed = await self._renew_hot(meta, answer, origin=origin)
                if renewed is not None:
                    log.info("hot_copy_revalidated", key=meta.key, owner=peer.id,
                             expires_in=round(renewed.expires_at - self._clock(), 3))
                    served = await self.respond.hit(request, renewed, label=CacheOutcome.HOT_HIT)
                    if served is not None:
                        check.served = True
                        return served
                # Renewed as something else, or gone meanwhile: ask again, as any relayed read.
                again = await self.relay.relay(request, ahead, target=target, origin_url=url,
                                               on_manifest=self._chunked_from_peer)
                if again is None:
                    raise web.HTTPServiceUnavailable(
                        text=f"{meta.key}: its owners stopped answering while {self.node_id} renewed its copy\n")
                return again
            if answer.status < 500 and answer.status != 412:
                check.replaced = 200 <= answer.status < 300
                await self._drop_hot(meta, why="replaced at the owner")
            elif not meta.fresh(self._clock()):
                await self._drop_hot(meta, why="expired")
            return None

        return on_answer

    async def _renew_hot(self, meta: Meta, answer: aiohttp.ClientResponse, *, origin: Origin) -> Meta | None:
        """The hot copy `meta` renewed by its owner's 304: the fields the 304
        updates (RFC 9111 §3.2) and the owner's expiry, never later; None
        when the copy went or changed meanwhile, or the 304 made it
        unstorable (it is then dropped)."""
        now = self._clock()
        merged, renewed = renewed_by_304(meta.status, meta.headers, answer.headers.items(), now=now,
                                         policy_ttl=origin.default_ttl, targeted=origin.targeted_cache_control)
        if not renewed.storable:
            await self._drop_hot(meta, why=f"not storable any more: {renewed.reason}")
            return None
        expires_at = owner_expiry(answer.headers.get(EXPIRES_HEADER), fallback=now + renewed.ttl)
        new = await self.store.refresh(meta, headers=merged, stored_at=now, expires_at=expires_at,
                                       age=current_age(answer.headers, now), stale_if_error=renewed.stale_if_error,
                                       stale_while_revalidate=renewed.stale_while_revalidate)
        if new is meta or new.data != meta.data or not new.hot:
            return None
        return new

    async def _chunked_from_peer(self, request: web.Request, answer: aiohttp.ClientResponse,
                                 peer: Peer) -> web.StreamResponse | None:
        """The owner of a chunked object's key answered a relayed read with its
        manifest (CHUNKED_HEADER): this node reads the chunks from their owners
        itself and answers the client, so the object's bytes do not funnel
        through the manifest's owner. None: a manifest that cannot be read
        (the relay then goes on as if the owner had not answered)."""
        try:
            manifest = Manifest.decode(answer.headers[CHUNKED_HEADER])
            expires_at = float(answer.headers[EXPIRES_HEADER])
        except (KeyError, ValueError, TypeError) as e:
            log.warning("manifest_unreadable", peer=peer.id, error=f"{type(e).__name__}: {e}")
            return None
        key = access(request).key or ""
        now = self._clock()
        meta = Meta(key=key, url=key, host=host_of(key), size=0, headers=stored_pairs(answer.headers),
                    stored_at=now, expires_at=expires_at, age=current_age(answer.headers, now),
                    chunk_size=manifest.chunk_size, length=manifest.length)
        access(request).peer = peer.id
        # The owner's own outcome (a miss when its flight stored the manifest just now), as a relay says it.
        return await self.respond.hit(request, meta, label=relayed(answer.headers.get(CACHE_HEADER, CacheOutcome.HIT)))

    async def _drop_hot(self, meta: Meta, *, why: str) -> None:
        if await self.store.remove_one(meta):
            self.counts.gone(meta)
            log.info("hot_copy_dropped", key=meta.key, reason=why)

    def _names_origin(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        return host_header.rsplit(":", 1)[0].lower().rstrip(".") in self._table

    async def admin(self, request: web.Request) -> web.Response:
        """/healthz, /readyz or /metrics (`request.raw_path`), also for the admin port."""
        return await self._admin(request)

    async def _admin(self, request: web.Request) -> web.Response:
        access(request).cache = "admin"
        if request.raw_path == "/healthz":
            return web.Response(text="ok\n")
        if request.raw_path == "/readyz":
            # Redis down is reported but does not make the node unready: it keeps serving.
            detail = self.status()
            return web.json_response(detail, status=200 if detail["ready"] else 503)
        if self.before_metrics is not None:
            await self.before_metrics()
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    # -- other methods -------------------------------------------------------------
    async def _forward(self, request: web.Request, *, url: str, key: str, target: Target) -> web.StreamResponse:
        """Any method but GET and HEAD goes to the origin as sent, body streamed.

        A success of an unsafe one invalidates what the cache holds for the
        URL, and for Location and Content-Location on the same host (RFC
        9111 §4.4), here and on the key's owners, before the client hears
        of it: a GET that follows a finished PUT never gets the old bytes.
        """
        async def on_response(response: aiohttp.ClientResponse) -> None:
            if request.method in SAFE_METHODS or not 200 <= response.status < 400:
                return
            keys = [key]
            for name in ("Location", "Content-Location"):
                other = self._same_host_key(response.headers.get(name), target)
                if other is not None and other not in keys:
                    keys.append(other)
            await self.invalidate(keys, why=f"{request.method} {target.path[:200]} answered {response.status}")

        return await self.respond.passthrough(request, url, label=CacheOutcome.PASS, on_response=on_response)

    def _same_host_key(self, reference: str | None, base: Target) -> str | None:
        """The cache key a Location or Content-Location names, when it is on the
        request's own host (§4.4 forbids invalidating another host's objects)."""
        if not reference:
            return None
        try:
            absolute = urlsplit(urljoin(f"{base.scheme}://{base.host}{base.path_qs}", reference.strip()))
            if absolute.scheme != base.scheme or (absolute.hostname or "").rstrip(".") != base.host:
                return None
            path_qs = (absolute.path or "/") + (f"?{absolute.query}" if absolute.query else "")
            _, _, key = self._resolve(path_qs, base.host, scheme=base.scheme)
        except (ValueError, BadTarget):
            return None
        return key

    async def invalidate(self, keys: list[str], *, why: str) -> None:
        """Forget `keys` here and on every other node that may hold them, owner
        or hot copy (their copies would answer a GET with what the write replaced)."""
        await self.invalidation.everywhere(keys, why=why)

    async def _forget_lost(self, meta: Meta) -> None:
        """A stored object whose data file is gone although the index still has
        it (not evicted, not replaced: removed behind the node's back, or a
        disk fault). Forget it, so the request refetches instead of failing."""
        log.warning("object_file_missing", key=meta.key, data=meta.data)
        if await self.store.remove_one(meta):
            self.counts.gone(meta)

    async def _get(self, request: web.Request, *, key: str, url: str, origin: Origin,
                   target: Target, directives: RequestDirectives) -> web.StreamResponse:
        # A joiner whose leader vanished retries; bounded so a pathological
        # origin cannot keep a request looping.
        for _ in range(5):
            meta = self.store.lookup(key, request.headers)
            use = self._use(meta, directives)
            if use is Use.FRESH or use is Use.STALE_WHILE_REVALIDATE:
                assert meta is not None
                if use is Use.STALE_WHILE_REVALIDATE:
                    self.engine.revalidate_soon(key=key, url=url, origin=origin, stale=meta, target=target,
                                          source=self.engine.origin_source(url, request.headers,
                                                                           route=parent_route(request)))
                served = await self.respond.hit(request, meta, label=_hit_label(meta) if use is Use.FRESH
                                                else CacheOutcome.STALE)
                if served is not None:
                    return served
                if self.store.lookup(key) is meta:
                    await self._forget_lost(meta)
                continue  # evicted or replaced between lookup and open, or lost
            if directives.no_store:
                # RFC 9111 §5.2.1.5: nothing of this exchange may be stored.
                return await self.respond.passthrough(request, url, label=CacheOutcome.PASS)
            flight, leader = self.engine.flights.lead_or_join(key)
            response: aiohttp.ClientResponse | None = None
            if leader:
                interim = InterimRelay(request)
                try:
                    outcome, response = await self.engine.lead(
                        flight, key=key, url=url, origin=origin, stale=meta, target=target,
                        source=self.engine.origin_source(url, request.headers, route=parent_route(request),
                                                         interim=interim))
                finally:
                    interim.close()
            else:
                outcome = await asyncio.shield(flight.outcome)
                if outcome.kind is Kind.STREAMING and outcome.fill is not None and outcome.fill.complete:
                    # The fill's whole response was in before this request came:
                    # it is no joiner, but a later request, judged by the stored
                    # object's freshness (a no-cache object is revalidated).
                    await flight.landed.wait()  # stored (or failed) by then
                    continue
                if not outcome.answers(request.headers):
                    # The leader's response varies on a field this request sets
                    # otherwise (RFC 9111 §4.1): it is not this request's answer.
                    if outcome.kind is Kind.STREAMING:
                        return await self.respond.passthrough(request, url, label=CacheOutcome.PASS)
                    continue
            if outcome.kind is Kind.STREAMING:
                assert outcome.fill is not None
                return await self.respond.fill(request, outcome.fill, label=CacheOutcome.MISS if leader else CacheOutcome.MISS_JOINED)
            if outcome.kind is Kind.REVALIDATED or outcome.kind is Kind.STORED:
                assert outcome.meta is not None
                label = (CacheOutcome.REVALIDATED if outcome.kind is Kind.REVALIDATED
                         else CacheOutcome.MISS if leader else CacheOutcome.MISS_JOINED)
                served = await self.respond.hit(request, outcome.meta, label=label)
                if served is not None:
                    return served
                continue
            if outcome.kind is Kind.PASSED:
                if response is not None and any(name in request.headers for name in NOT_FOR_FILLS):
                    # The fill's request left out this client's Range and
                    # validators; a response that is not stored is this
                    # client's alone, so it asks again, as it asked.
                    response.release()
                    response = None
                return await self.respond.passthrough(request, url, label=CacheOutcome.PASS, response=response)
            error = outcome.error
            if isinstance(error, LeaderGone):
                continue
            if meta is not None and may_serve_stale_on_error(now=self._clock(), expires_at=meta.expires_at,
                                                             stale_if_error=meta.stale_if_error):
                log.warning("serving_stale", key=key, error=str(error))
                served = await self.respond.hit(request, meta, label=CacheOutcome.STALE, stale_reason=str(error))
                if served is not None:
                    return served
            raise origin_failure(error)
        raise web.HTTPServiceUnavailable(text=f"gave up on {key}: the origin exchange kept restarting\n")

    def from_peer(self, request: web.Request) -> bool:
        """A request another node of this cluster relayed (cachenode/cluster/peer_auth.py): X-Nezha-Peer with the
        cluster token. One from a client that merely says so asks the owners and is counted."""
        return is_peer_request(request, self.settings.cluster_token)



_PLAIN_CACHE = 4096  # entries in each fast-path memo; cleared when full


@dataclass
class _HotCheck:
    """One request's revalidation of a hot copy with the key's owner."""

    meta: Meta
    fields: dict[str, str]  # the conditional fields sent instead of the client's
    client_if_none_match: str | None
    served: bool = False  # answered by the relay's look at the owner's answer (_hot_answer)
    replaced: bool = False  # the owner answered 2xx: its version is not the copy's


def _bypass_reason(request: web.Request, target: Target, origin: Origin, *, authorize: bool) -> str | None:
    """Why this GET or HEAD goes to the origin untouched, nothing of it
    stored or served from disk; None: the cache may answer it."""
    if authorize:
        # Credentials are welcome (each read is authorised); a cookie stays
        # the client's own, and a request that sets a field the probe sets
        # cannot be made into one.
        if "Cookie" in request.headers:
            return "request carries Cookie"
        return not_probeable(request.headers)
    reason = request_bypasses_cache(request.headers)
    if reason is None and (kept := credentials_kept(target, origin)):
        reason = f"request URL carries credentials ({', '.join(kept)})"
    return reason


def _hit_label(meta: Meta) -> CacheOutcome:
    """A fresh stored object's X-Nezha-Cache: a hot copy says so."""
    return CacheOutcome.HOT_HIT if meta.hot else CacheOutcome.HIT


def _object_size(response: web.StreamResponse) -> int | None:
    """The whole object's length from a relayed answer: its Content-Length,
    or a 206's Content-Range total; None when it does not say."""
    if response.status == 206:
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        return int(total) if total.isdigit() else None
    if response.status == 200:
        return response.content_length
    return None


def _ahead_of(node_id: str, owners: list[Peer]) -> list[Peer]:
    """The owners to ask before serving a key here: all of them for a
    non-owner, those before this node in ring order for a replica, none for
    the first owner."""
    for i, p in enumerate(owners):
        if p.id == node_id:
            return owners[:i]
    return owners


# The owner's X-Nezha-Cache, as seen by the relay -> the relay's counter.
_RELAY_OUTCOME = {relayed(CacheOutcome.HIT): "peer_hits", relayed(CacheOutcome.AUTHORIZED): "peer_hits", relayed(CacheOutcome.REVALIDATED): "peer_hits",
                  relayed(CacheOutcome.STALE): "peer_hits", relayed(CacheOutcome.MISS): "misses", relayed(CacheOutcome.MISS_JOINED): "misses"}
