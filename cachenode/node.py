"""CacheNode: its lifecycle (start, stop, leave), the handler that routes each request,
and the I/O of leading a flight; `front/` writes the responses.

Request path, in order: CONNECT and TRACE (405, a middleware); admin
endpoints; target parsing (400); origin allow-list (403, the origin never
contacted); methods other than GET and HEAD (forwarded, body streamed; a
success invalidates); credentials (pass through, never stored); then hit,
join a flight, or lead one. What crosses and what is stored:
docs/http-semantics.md.

A response is either a single sendfile of a stored object, a stream from a
fill's growing temp file, or a pass-through copy of the origin's response.
None of them holds a whole object in memory.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import AsyncIterator, Callable, Mapping
from urllib.parse import urljoin, urlsplit

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from cachenode.kernel import splice
from cachenode.front.access import access
from cachenode.cluster.view import ClusterView
from nezha.ring import Peer
from cachenode.front.fastpath import response_head
from cachenode.front.middleware import REFUSED_METHODS, SAFE_METHODS
from cachenode.fill.parallel import RangedFetch, Validator, parallel_validator, plain_rest
from cachenode.fill.flights import Fill, Flight, Flights, Kind, Outcome, Source, Superseded, run_fill_in_background
from cachenode.fill.lead import Answer, Body, How, Plan, Step, decide, plan_fill
from cachenode.cluster.handoff import Handoff
from cachenode.http.headers import Pairs
from cachenode.cluster.invalidation import Invalidation
from cachenode.http.freshness import (Policy, RequestDirectives, Use, current_age, judge,
                                 may_serve_stale_on_error, request_bypasses_cache, request_directives,
                                 response_policy)
from cachenode.http.headers import header_bytes, stored_pairs, updated_by_304
from cachenode.http.vary import variant as variant_of
from cachenode.http.vary import vary_names
from nezha.keys import BadHost, BadTarget, Target, key_for, parse_target
from cachenode.metrics import Metrics
from cachenode.fill.origin import OriginClient, ends_at_close, forwarded_request_headers
from cachenode.front.relay import PeerRelay
from cachenode.cluster.peer_auth import is_peer_request
from cachenode.front.respond import (CONTINUE_DEFERRED, Responder, origin_failure,
                             send_continue)
from cachenode.store.disk import Meta, NotStored, Store
from nezha.config import CacheSettings, Origin
from nezha.errors import FillAborted, NezhaError, OriginError
from nezha.wire import (ADMIN_PATHS, CACHE_HEADER, EXPIRES_HEADER, INTERNAL_PREFIX, SCHEME_HEADER, CacheOutcome,
                        DrainOutcome, relayed)

log = structlog.get_logger("nezha.cachenode")



class LeaderGone(FillAborted):
    """The request leading a flight ended before the origin answered."""


# A fill reads its origin (or peer) in pieces of up to this size: one per
# object however many clients wait, so larger than a client stream's
# chunk_size. Quick benches gave 1.12-1.32 node CPU seconds per GiB filled
# at 1 MiB against 1.32-1.52 at 256 KiB: single runs, noisy, in the same
# direction (docs/benchmarks.md, "Cold fills in parallel ranges").
FILL_READ = 1024 * 1024
# A fill asks for the whole object whatever one client asked: its own
# validators replace the client's, and Range is applied to the stored bytes.
_NOT_FOR_FILLS = frozenset({"range", "if-range", "if-match", "if-none-match", "if-modified-since",
                            "if-unmodified-since"})


class CacheNode:
    def __init__(self, *, settings: CacheSettings, store: Store, origins: OriginClient,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.time,
                 cluster: ClusterView | None = None, index=None) -> None:
        self.settings = settings
        self.store = store
        self.origins = origins
        self.metrics = metrics or Metrics()
        self.flights = Flights()
        self.node_id = settings.identity
        self.cluster = cluster or ClusterView(node_id=self.node_id, replicas=settings.replicas)
        self.index = index  # nezha.index.Index or None: stats and locations, never awaited on the hot path
        # A cold owner sends its headers once the origin sent its own: within
        # the origin's connect and read timeouts; a frozen one is found sooner,
        # by probing it (the rules are in cachenode/front/relay.py).
        self.relay = PeerRelay(
            node_id=self.node_id, client=origins, peer_timeout=settings.peer_timeout,
            header_timeout=settings.origin_connect_timeout + settings.origin_read_timeout + settings.peer_timeout,
            read_timeout=settings.origin_read_timeout + settings.peer_timeout, chunk_size=settings.chunk_size,
            cluster_token=settings.cluster_token)
        self._table = settings.origin_table
        self._clock = clock
        self._tasks: set[asyncio.Task] = set()
        self._fills: dict[asyncio.Task, Fill] = {}  # each fill's background task: settled() skips parked ones
        self._ready = False
        self.handoff = Handoff(node_id=self.node_id, settings=settings, cluster=self.cluster, store=store,
                               flights=self.flights, client=origins, lead=self.lead, spawn=self.spawn)
        self.invalidation = Invalidation(node_id=self.node_id, settings=settings, cluster=self.cluster,
                                         client=origins, internal_headers=self.handoff.internal_headers,
                                         forget=self.forget)
        self._hit_requests = self.metrics.requests.labels(cache=CacheOutcome.HIT)
        # The fast path's memo: request line and Host -> key, key -> (meta, head, path).
        self._plain_keys: dict[tuple[str, str], str] = {}
        self._plain_heads: dict[str, tuple[Meta, bytes, str]] = {}
        self.respond = Responder(settings=settings, store=store, origins=origins, count=self._count, clock=clock)

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        await self.store.open()
        await self.origins.start()
        if self.index is not None:
            self.index.on_membership(self.cluster.update)
            await self.index.start()
            if self.index.membership is not None:
                self.cluster.update(self.index.membership)
        self._update_store_gauges()
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.index is not None:
            await self.index.close()
        await self.origins.close()

    def spawn(self, coro) -> asyncio.Task:
        """Run background work that `stop()` cancels and `settled()` waits for."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def settled(self) -> None:
        """Wait for fills and other background work in progress to finish, or
        to park: an on-demand fill waiting for clients to ask for more of it
        (cachenode/fill/parallel.py) is at rest."""
        while busy := [t for t in self._tasks if not (t in self._fills and self._fills[t].parked)]:
            await asyncio.wait(busy, timeout=0.05)
        await self.store.idle()  # and the disk steps they left behind (unlinks)

    async def leave(self) -> str:
        """On SIGTERM: hand every object to its owners if the ring no longer has
        this node; exit at once if it does. What happened, for the log.

        Kubernetes does not say whether a termination is permanent. The
        controller does: a pod a scale-down removes (ordinal at or above the
        new replicas) is taken out of the ring and named in its `leaving`
        set, in one write; a restarted or evicted pod also leaves the ring
        while it terminates, but is not named, and comes back with its disk.
        The SIGTERM may arrive before that write, so the node waits up to
        `leave_settle` for it. Only a node named leaving hands off, bounded
        by `shutdown_grace`.
        """
        s = self.settings
        if self.index is None:
            return DrainOutcome.STANDALONE
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.shutdown_grace
        settle = loop.time() + min(s.leave_settle, s.shutdown_grace)
        while self._in_ring() and not self._named_leaving() and loop.time() < settle:
            await asyncio.sleep(0.05)
        if not self._named_leaving() or not self.cluster.clustered:
            log.info("node_leaving", reason="not leaving for good: a restart keeps its disk", handoff=False,
                     in_ring=self._in_ring())
            return DrainOutcome.RESTART
        if len(self.store) == 0:
            log.info("node_leaving", reason="out of the ring, nothing stored", handoff=False)
            return DrainOutcome.EMPTY
        log.info("node_leaving", reason="out of the ring: handing objects off", handoff=True,
                 objects=len(self.store), seconds=round(deadline - loop.time(), 1))
        started = time.time()
        try:
            progress = await asyncio.wait_for(self.handoff.run(self.cluster), timeout=max(0.1, deadline - loop.time()))
            outcome = DrainOutcome.INCOMPLETE if progress.failed else DrainOutcome.HANDED_OFF
        except asyncio.TimeoutError:
            progress = self.handoff.progress
            log.error("handoff_unfinished", done=progress.done, total=progress.total, failed=progress.failed,
                      reason=f"shutdown_grace ({s.shutdown_grace:g}s) ran out")
            outcome = DrainOutcome.TIMED_OUT
        if progress.failed:
            log.error("handoff_incomplete", failed=progress.failed, total=progress.total, errors=progress.errors[:5])
        # For the controller's Events: it cannot ask a node that has exited.
        await self.index.record_drain({"outcome": outcome, "started": round(started, 3), "total": progress.total,
                                       "done": progress.done, "copied": progress.copied, "present": progress.present,
                                       "skipped": progress.skipped, "failed": progress.failed,
                                       "bytes": progress.bytes, "errors": progress.errors[:20]})
        return outcome

    def _in_ring(self) -> bool:
        return self.node_id in self.cluster.snapshot.nodes

    def _named_leaving(self) -> bool:
        return self.node_id in self.cluster.snapshot.leaving and not self._in_ring()

    def on_evict(self, meta: Meta) -> None:
        self._object_gone(meta, evictions=1)

    def _object_gone(self, meta: Meta, **extra: int) -> None:
        """Count and index an object that left the store."""
        self._count(meta.host, objects=-1, bytes_stored=-meta.size, **extra)
        if self.index is not None:
            self.index.object_removed(meta.key, host=meta.host, size=meta.size)
        self._update_store_gauges()

    async def _forget_lost(self, meta: Meta) -> None:
        """A stored object whose data file is gone although the index still has
        it (not evicted, not replaced: removed behind the node's back, or a
        disk fault). Forget it, so the request refetches instead of failing."""
        log.warning("object_file_missing", key=meta.key, data=meta.data)
        if await self.store.remove_one(meta):
            self._object_gone(meta)

    def _update_store_gauges(self) -> None:
        self.metrics.stored_bytes.set(self.store.used_bytes)
        self.metrics.stored_objects.set(len(self.store))

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
        if request.method not in ("GET", "HEAD"):
            return await self._forward(request, url=url, key=key, target=target)
        bypass = request_bypasses_cache(request.headers)
        if bypass is not None:
            return await self.respond.passthrough(request, url, label=CacheOutcome.BYPASS)
        meta = self.store.lookup(key, request.headers)
        directives = request_directives(request.headers)
        use = self._use(meta, directives)
        fresh = use is Use.FRESH or use is Use.STALE_WHILE_REVALIDATE  # served from here without waiting
        if directives.only_if_cached and not fresh:
            raise web.HTTPGatewayTimeout(text=f"{key} is not cached on {self.node_id}\n")
        if fresh and self.index is not None:
            self.index.object_accessed(key)
        # Only the first live owner fills from the origin. A replica that
        # misses asks the owners ahead of it, like a non-owner asks them all;
        # if none answers it is the first live owner and fills. A relayed
        # request (X-Nezha-Peer, from a peer) is never relayed again: at most one hop.
        owners = [] if self.from_peer(request) or fresh else self.cluster.owners(key)
        ahead = _ahead_of(self.node_id, owners)
        if ahead:
            relayed = await self.relay.relay(request, ahead, target=target, origin_url=url)
            if relayed is not None:
                record = access(request)
                outcome = _RELAY_OUTCOME.get(record.cache or "")
                self._count(target.host, metrics=False, bytes_served=record.bytes,
                            **({outcome: 1} if outcome else {}))
                if len(ahead) < len(owners) and request.method == "GET":
                    self._keep_copy(record, ahead, target)
                return relayed
            log.warning("owners_unreachable", key=key, owners=[p.id for p in ahead])
        if request.method == "HEAD":
            if fresh:
                return await self.respond.hit(request, meta, label=CacheOutcome.HIT)
            return await self.respond.passthrough(request, url, label=CacheOutcome.PASS)
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
        if request.secure:
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
    def plain_hit(self, raw_target: str, host_header: str) -> tuple[Meta, bytes, str] | None:
        """The fresh stored object a plain GET/HEAD asks for, with its response
        head and data path, if this node serves it itself as `handle()` would (a
        fresh local copy is served whoever owns the key). None sends the request
        through the full handler."""
        key = self._plain_keys.get((raw_target, host_header))
        if key is None:
            if not self._names_origin(host_header):
                return None
            try:
                _, _, key = self._resolve(raw_target, host_header)
            except BadTarget:
                return None
            if key is None:
                return None
            if len(self._plain_keys) >= _PLAIN_CACHE:
                self._plain_keys.clear()
            self._plain_keys[(raw_target, host_header)] = key
        meta = self.store.lookup(key)
        if meta is None or meta.status != 200 or not meta.fresh(self._clock()):
            return None
        prepared = self._plain_heads.get(key)
        if prepared is None or prepared[0] is not meta:
            if len(self._plain_heads) >= _PLAIN_CACHE:
                self._plain_heads.clear()
            prepared = self._plain_heads[key] = (meta, response_head(meta, via=self.respond.via),
                                                        self.store.data_path(meta))
        return prepared

    def fast_hit_done(self, meta: Meta, *, method: str, path: str, sent: int, ms: float,
                      gone: bool = False) -> None:
        """Count and log a fast-path hit exactly as the handler would, also when
        the client hung up mid-body (`gone`)."""
        self._count(meta.host, hits=1, bytes_served=sent)
        if self.index is not None:
            self.index.object_accessed(meta.key)
        self._hit_requests.inc()
        if gone:
            log.info("client_gone", key=meta.key, bytes=sent)
        log.info("request_completed", method=method, host=meta.host, path=path[:300], status=200, cache=CacheOutcome.HIT,
                 bytes=sent, ms=round(ms, 2), fast=True, **({"broken": True} if gone else {}))

    def _keep_copy(self, record, ahead: list[Peer], target: Target) -> None:
        """A replica that relayed an owner's hit copies the object, so it holds
        its replica from now on. After a miss there is nothing to do: the
        owner's fill pushes the copy here when it completes."""
        if record.broken or record.cache not in (relayed(CacheOutcome.HIT), relayed(CacheOutcome.REVALIDATED)):
            return
        peer = next((p for p in ahead if p.id == record.peer), None)
        if peer is not None:
            self.handoff.copy_soon(peer, target)

    def _names_origin(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        return host_header.rsplit(":", 1)[0].lower().rstrip(".") in self._table

    def status(self) -> dict:
        snap = self.cluster.snapshot
        detail = {"ready": self._ready, "node": self.node_id, "pid": os.getpid(), "replicas": self.cluster.replicas,
                  "objects": len(self.store),
                  "bytes": self.store.used_bytes, "fills_in_flight": len(self.flights),
                  "ring_epoch": snap.epoch, "ring_nodes": sorted(snap.nodes)}
        if self.index is not None:
            detail["index"] = self.index.status()
        return detail

    async def _admin(self, request: web.Request) -> web.Response:
        access(request).cache = "admin"
        if request.raw_path == "/healthz":
            return web.Response(text="ok\n")
        if request.raw_path == "/readyz":
            # Redis down is reported but does not make the node unready: it keeps serving.
            return web.json_response(self.status(), status=200 if self._ready else 503)
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
        """Forget `keys` here and on every other owner of each (their copies
        would answer a GET with what the write replaced)."""
        await self.forget(keys, why=why)
        await self.invalidation.tell_owners(keys, why=why)

    async def forget(self, keys: list[str], *, why: str) -> int:
        """Remove what this node stores for `keys`; how many objects went."""
        removed = 0
        for key in keys:
            self.flights.supersede(key)
            for meta in await self.store.remove(key):  # every variant
                self._object_gone(meta)
                log.info("object_invalidated", key=key, reason=why)
                removed += 1
        return removed

    # -- GET ---------------------------------------------------------------------
    def origin_source(self, url: str, request: web.Request) -> Source:
        """The origin, asked with the leading client's own fields (all but its
        validators and Range: the fill fetches the whole object for everyone)."""
        headers = forwarded_request_headers(request.headers, via=self.respond.via, drop=_NOT_FOR_FILLS)
        return Source(url=url, what=f"origin {url}", headers=headers, ranged="Range" in request.headers)

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
                    self._revalidate_soon(key=key, url=url, origin=origin, stale=meta, target=target,
                                          source=self.origin_source(url, request))
                served = await self.respond.hit(request, meta, label=CacheOutcome.HIT if use is Use.FRESH else CacheOutcome.STALE)
                if served is not None:
                    return served
                if self.store.lookup(key) is meta:
                    await self._forget_lost(meta)
                continue  # evicted or replaced between lookup and open, or lost
            if directives.no_store:
                # RFC 9111 §5.2.1.5: nothing of this exchange may be stored.
                return await self.respond.passthrough(request, url, label=CacheOutcome.PASS)
            flight, leader = self.flights.lead_or_join(key)
            response: aiohttp.ClientResponse | None = None
            if leader:
                outcome, response = await self.lead(flight, key=key, url=url, origin=origin, stale=meta,
                                                    target=target, source=self.origin_source(url, request))
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
            if outcome.kind is Kind.REVALIDATED:
                assert outcome.meta is not None
                served = await self.respond.hit(request, outcome.meta, label=CacheOutcome.REVALIDATED)
                if served is not None:
                    return served
                continue
            if outcome.kind is Kind.PASSED:
                if response is not None and any(name in request.headers for name in _NOT_FOR_FILLS):
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

    async def lead(self, flight: Flight, *, key: str, url: str, origin: Origin, stale: Meta | None,
                   target: Target, source: Source) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        """Ask the source once for everybody waiting on `key`; the step taken
        with its answer is `fill/lead.py`'s decision, this is only its I/O."""
        response: aiohttp.ClientResponse | None = None
        try:
            try:
                response = await self._ask(source, stale)
            except OriginError as e:
                self.flights.land(flight)
                self._count(target.host, failed_fills=1)
                return self._resolve_flight(flight, Outcome(Kind.FAILED, error=e)), None
            now = self._clock()
            policy = response_policy(response.status, response.headers, now=now, policy_ttl=origin.default_ttl)
            expires_at = now + policy.ttl
            kept = stored_pairs(response.headers)
            names = vary_names(response.headers)
            decision = decide(_answer(response, policy=policy, vary=names, kept=kept, source=source,
                                      fits=self.store.fits),
                              stale_held=stale is not None, stale_usable_on_error=stale is not None and (
                                  may_serve_stale_on_error(now=now, expires_at=stale.expires_at,
                                                           stale_if_error=stale.stale_if_error)))
            if decision.step is Step.PEER_REFUSED:
                # A peer copy is all or nothing: a replica never falls back to the origin.
                error = OriginError(f"{source.what} answered {response.status} for {key}")
                response.release()
                return self._landed(flight, Outcome(Kind.FAILED, error=error)), None
            if source.peer is not None:
                try:
                    expires_at = float(response.headers.get(EXPIRES_HEADER, expires_at))
                except ValueError:
                    pass
            if decision.step is Step.REVALIDATED:
                assert stale is not None
                response.release()
                meta = await self._revalidated(stale, response, key=key, now=now, origin=origin)
                return self._landed(flight, Outcome(Kind.REVALIDATED, meta=meta)), None
            if decision.step is Step.STALE_ON_ERROR:
                response.release()
                error = OriginError(f"{source.what} returned {response.status}")
                return self._landed(flight, Outcome(Kind.FAILED, error=error)), None
            if decision.step is Step.PASS:
                log.info("response_not_stored", key=key, reason=decision.reason)
                return self._landed(flight, Outcome(Kind.PASSED)), response
            fill = await self._start_fill(flight, response, key=key, url=url, host=target.host, headers=kept,
                                          expires_at=expires_at, policy=policy, now=now, target=target,
                                          source=source, vary=names, origin=origin)
            response = None  # the fill owns it now
            return self._resolve_flight(flight, Outcome(Kind.STREAMING, fill=fill)), None
        except BaseException as e:
            if response is not None:
                response.release()
            if not flight.outcome.done():
                self.flights.abort(flight, LeaderGone(f"request leading the fetch of {key} ended: {e!r}"))
            raise

    async def _ask(self, source: Source, stale: Meta | None) -> aiohttp.ClientResponse:
        """The source's answer to the fill's request, made conditional on what is stored."""
        headers = CIMultiDict(source.headers)
        if stale is not None:
            if stale.etag:
                headers["If-None-Match"] = stale.etag
            if stale.last_modified:
                headers["If-Modified-Since"] = stale.last_modified
        if source.peer is not None:
            # A copy is served from the source's disk or refused at once;
            # a source that stops answering is given up by probing it.
            return await self.relay.ask(source.peer, "GET", source.url, headers=headers,
                                        header_timeout=self.settings.origin_read_timeout)
        return await self.origins.request("GET", source.url, headers=headers, what=source.what)

    @staticmethod
    def _resolve_flight(flight: Flight, outcome: Outcome) -> Outcome:
        flight.resolve(outcome)
        return outcome

    def _landed(self, flight: Flight, outcome: Outcome) -> Outcome:
        """End `flight` with `outcome`: nothing of it is left to store."""
        self.flights.land(flight)
        return self._resolve_flight(flight, outcome)

    async def _revalidated(self, stale: Meta, response: aiohttp.ClientResponse, *, key: str, now: float,
                           origin: Origin) -> Meta:
        """The stored object `stale`, renewed by the 304 `response`."""
        # The 304's fields update the stored ones (RFC 9111 §3.2); its
        # Age (not stored) shortens the lifetime it grants, and the
        # object's age restarts from it.
        merged = updated_by_304(stale.headers, response.headers)
        judged = CIMultiDict(merged)
        for name in ("Age", "Date"):  # not stored, but they date the 304
            if name in response.headers:
                judged[name] = response.headers[name]
        renewed = response_policy(stale.status, judged, now=now, policy_ttl=origin.default_ttl)
        meta = await self.store.refresh(
            stale, headers=merged, stored_at=now, expires_at=now + renewed.ttl,
            age=current_age(response.headers, now), stale_if_error=renewed.stale_if_error,
            stale_while_revalidate=renewed.stale_while_revalidate)
        if not renewed.storable:
            # The 304 made it one client's (private, no-store, Set-Cookie):
            # this request may have it, nobody after (RFC 9111 §3.2, §3).
            log.info("object_not_kept", key=key, reason=renewed.reason)
            if await self.store.remove_one(meta):
                self._object_gone(meta)
        return meta

    async def _start_fill(self, flight: Flight, response: aiohttp.ClientResponse, *, key: str, url: str,
                          host: str, headers: Pairs, expires_at: float, policy: Policy, now: float,
                          target: Target, source: Source, vary: tuple[str, ...], origin: Origin) -> Fill:
        length = response.content_length
        try:
            temp = await self.store.new_temp()
        except NezhaError:
            response.release()
            raise
        temp.reserved = length or 0
        self.store.reserve(temp.reserved)
        # A peer's copy carries the owner's expiry (EXPIRES_HEADER) instead of an age.
        age = current_age(response.headers, now) if source.peer is None else 0.0
        # Stored per variant: under the values the fill's own request had
        # for the fields the response varies on (RFC 9111 §4.1).
        variant = variant_of(vary, source.headers) if vary else ""
        fill = Fill(key=key, headers=headers, length=length, temp=temp, age=age, status=response.status,
                    vary=vary, variant=variant, delimited_by_close=ends_at_close(response))
        meta = Meta(key=key, url=url, host=host, size=0, headers=headers, stored_at=now, status=response.status,
                    expires_at=expires_at, stale_if_error=policy.stale_if_error, age=age,
                    stale_while_revalidate=policy.stale_while_revalidate, vary=vary, variant=variant)
        self.metrics.fills_in_flight.inc()
        from_origin = self.metrics.bytes_from_origin

        def on_bytes(n: int) -> None:
            if source.peer is None:
                from_origin.inc(n)
                self._count(host, bytes_from_origin=n, metrics=False)

        streams = origin.fill_streams or self.settings.fill_streams
        validator = parallel_validator(
            response.status, response.headers, length, streams=streams,
            threshold=origin.parallel_fill_threshold or self.settings.parallel_fill_threshold)
        plan = plan_fill(Body(from_peer=source.peer is not None, delimited_by_close=fill.delimited_by_close,
                              rangeable=validator is not None, client_ranged=source.ranged),
                         splice_fills=self.settings.splice_fills,
                         fill_on_range=origin.fill_on_range if origin.fill_on_range is not None
                         else self.settings.fill_on_range)
        ranged = None
        if plan.how is How.PARALLEL:
            assert validator is not None
            ranged = self._ranged_fetch(response, fill, source, validator, on_bytes, streams=streams,
                                        on_demand=plan.on_demand, landed=flight.landed)
        work = self._fill_work(flight, fill, response, meta=meta, plan=plan, ranged=ranged, on_bytes=on_bytes,
                               source=source, target=target)
        task = self.spawn(run_fill_in_background(self.flights, flight, fill, work))
        self._fills[task] = fill
        task.add_done_callback(lambda t: self._fills.pop(t, None))
        return fill

    async def _fill_work(self, flight: Flight, fill: Fill, response: aiohttp.ClientResponse, *, meta: Meta,
                         plan: Plan, ranged, on_bytes: Callable[[int], None], source: Source,
                         target: Target) -> Meta:
        """Read the body as `plan` says into the fill, then store and count it."""
        key, url, host = meta.key, meta.url, meta.host
        started = time.monotonic()
        # A copy from a peer that freezes mid-body fails within seconds, not
        # after the read timeout (the origin is not probed: it has no /healthz).
        watch = self.relay.guard(source.peer, response, lambda: fill.written) if source.peer else None
        try:
            stored = await self._read_body(flight, fill, response, meta=meta, plan=plan, ranged=ranged,
                                           on_bytes=on_bytes)
        except NotStored:
            raise  # streamed whole to its clients, only not stored: not a failed fill
        except NezhaError:
            self._count(host, failed_fills=1)
            raise
        except Exception as e:
            # A bug outside the fill's own run (which turns every error into
            # a NezhaError): its clients must learn it, not wait forever.
            self._count(host, failed_fills=1)
            error = FillAborted(f"fill of {key} from {url} crashed: {type(e).__name__}: {e}")
            log.error("fill_crashed", key=key, url=url, error=f"{type(e).__name__}: {e}")
            if fill.error is None:
                fill.error = error
                await fill.writes_done()  # no thread may still write the file it closes
                await self.store.discard(fill.temp)
                fill.advance(0)  # wakes its readers, who find the error
            raise error from e
        finally:
            if watch is not None:
                watch.cancel()
            self.metrics.fills_in_flight.dec()
        if flight.superseded and await self.store.remove_one(stored):  # the write came during the commit
            raise Superseded(f"a write to {url} succeeded while {key} was being stored")
        self._update_store_gauges()
        self._count(host, objects=1, bytes_stored=stored.size)
        if self.index is not None:
            self.index.object_stored(key, url=url, host=host, size=stored.size)
        log.info("fill_completed", key=key, bytes=stored.size, source=source.peer.id if source.peer else "origin",
                 seconds=round(time.monotonic() - started, 3))
        if source.peer is None:
            self.handoff.replicate_soon(stored, target)
        return stored

    async def _read_body(self, flight: Flight, fill: Fill, response: aiohttp.ClientResponse, *, meta: Meta,
                         plan: Plan, ranged, on_bytes: Callable[[int], None]) -> Meta:
        superseded = lambda: flight.superseded  # noqa: E731
        if plan.how is How.PARALLEL:
            fetch, fallback = ranged
            return await fill.run_ranged(fetch, fallback, store=self.store, meta=meta, on_bytes=on_bytes,
                                         superseded=superseded)
        if plan.how is How.SPLICED and (taken := splice.take(response)) is not None:
            return await fill.run_spliced(taken, store=self.store, meta=meta,
                                          read_timeout=self.settings.origin_read_timeout,
                                          on_bytes=on_bytes, superseded=superseded)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_chunked(FILL_READ):
                    yield chunk
            finally:
                response.release()

        return await fill.run(body(), store=self.store, meta=meta, on_bytes=on_bytes, superseded=superseded)

    def _ranged_fetch(self, response: aiohttp.ClientResponse, fill: Fill, source: Source, validator: Validator,
                      on_bytes: Callable[[int], None], *, streams: int, on_demand: bool,
                      landed: asyncio.Event):
        """The parallel fetch of `fill`'s object, and its one-stream fallback (cachenode/fill/parallel.py)."""
        async def get(headers: Mapping[str, str]) -> aiohttp.ClientResponse:
            return await self.origins.request("GET", source.url, headers=headers, what=source.what)

        async def write_at(offset: int, data: memoryview) -> None:
            await self.store.write_at(fill.temp, offset, data)

        async def pump(body: splice.SocketBody, offset: int, end: Callable[[], int],
                       moved: Callable[[int], None]) -> int:
            return await self.store.pump_into(fill.temp, body, offset, end=end, moved=moved, started=fill.track,
                                              read_timeout=self.settings.origin_read_timeout)

        fetch = RangedFetch(first=response, get=get, headers=source.headers, validator=validator,
                            length=fill.length or 0, streams=streams, write_at=write_at,
                            chunk_size=FILL_READ, on_bytes=on_bytes, on_demand=on_demand,
                            pump=pump if self.settings.splice_fills else None,
                            read_timeout=self.settings.origin_read_timeout, landed=landed)
        fetch.attach(fill)

        def fallback(offset: int) -> AsyncIterator[bytes]:
            return plain_rest(get, source.headers, offset=offset, length=fill.length or 0, validator=validator,
                              chunk_size=FILL_READ, what=source.what)

        return fetch, fallback

    def _revalidate_soon(self, *, key: str, url: str, origin: Origin, stale: Meta, target: Target,
                         source: Source) -> None:
        """Revalidate a stale object in the background while it is served
        (stale-while-revalidate, RFC 5861 §3); nothing if a fetch of the key
        is already under way."""
        if self.flights.get(key) is not None:
            return

        async def revalidate() -> None:
            flight, leader = self.flights.lead_or_join(key)
            if not leader:
                return
            _, response = await self.lead(flight, key=key, url=url, origin=origin, stale=stale,
                                          target=target, source=source)
            if response is not None:
                response.release()

        self.spawn(revalidate())

    def from_peer(self, request: web.Request) -> bool:
        """A request another node of this cluster relayed (cachenode/cluster/peer_auth.py): X-Nezha-Peer with the
        cluster token. One from a client that merely says so asks the owners and is counted."""
        return is_peer_request(request, self.settings.cluster_token)

    def _count(self, host: str, *, request: web.Request | None = None, metrics: bool = True,
               **deltas: int) -> None:
        """Count for Prometheus (what this node did) and for the Redis index.

        In the index each client request is counted once, by the node the
        client reached (docs/redis-schema.md): a node answering a peer's
        internal request leaves out the request fields. Batched there, never awaited.
        """
        if metrics:
            m = self.metrics
            for name, counter in (("hits", m.hits), ("misses", m.misses), ("bytes_served", m.bytes_served),
                                  ("bytes_from_origin", m.bytes_from_origin),
                                  ("failed_fills", m.fill_failures), ("evictions", m.evictions)):
                if deltas.get(name):
                    counter.inc(deltas[name])
        if self.index is not None:
            if request is not None and self.from_peer(request):
                deltas = {k: v for k, v in deltas.items() if k not in _REQUEST_FIELDS}
            if deltas:
                self.index.count(host, **deltas)


def _answer(response: aiohttp.ClientResponse, *, policy: Policy, vary: tuple[str, ...] | None, kept: Pairs,
            source: Source, fits: Callable[[int], bool]) -> Answer:
    """The facts about `response` that `fill/lead.py` decides on."""
    length = response.content_length
    return Answer(status=response.status, policy=policy, vary=vary,
                  vary_listed=", ".join(response.headers.getall("Vary", [])),
                  has_validator="ETag" in response.headers or "Last-Modified" in response.headers,
                  fits=length is None or fits(length), length=length,
                  header_bytes=header_bytes(kept), from_peer=source.peer is not None,
                  peer_says_hit=response.headers.get(CACHE_HEADER) == CacheOutcome.HIT)


_PLAIN_CACHE = 4096  # entries in each fast-path memo; cleared when full


def _ahead_of(node_id: str, owners: list[Peer]) -> list[Peer]:
    """The owners to ask before serving a key here: all of them for a
    non-owner, those before this node in ring order for a replica, none for
    the first owner."""
    for i, p in enumerate(owners):
        if p.id == node_id:
            return owners[:i]
    return owners


_REQUEST_FIELDS = frozenset({"hits", "misses", "peer_hits", "bytes_served"})
# The owner's X-Nezha-Cache, as seen by the relay -> the relay's counter.
_RELAY_OUTCOME = {relayed(CacheOutcome.HIT): "peer_hits", relayed(CacheOutcome.REVALIDATED): "peer_hits",
                  relayed(CacheOutcome.STALE): "peer_hits", relayed(CacheOutcome.MISS): "misses", relayed(CacheOutcome.MISS_JOINED): "misses"}
