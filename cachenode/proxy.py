"""The cache node's HTTP handlers: the only module that speaks HTTP to clients.

Request path, in order: admin endpoints; target parsing (400); origin
allow-list (403, the origin never contacted); method (405); credentials
(pass through, never stored); then hit, join a flight, or lead one.

A response is either a single sendfile of a stored object, a stream from a
fill's growing temp file, or a pass-through copy of the origin's response.
None of them holds a whole object in memory.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import IO, AsyncIterator, Callable

import aiohttp
import structlog
from aiohttp import web

from cachenode.fill import Fill, Flight, Flights, Kind, Outcome, run_fill_in_background
from cachenode.freshness import request_bypasses_cache, response_policy
from cachenode.keys import BadTarget, Target, cache_key, parse_target
from cachenode.metrics import Metrics
from cachenode.origin import OriginClient, end_to_end
from cachenode.ranges import Outcome as RangeOutcome
from cachenode.ranges import evaluate
from cachenode.store import KEPT_HEADERS, Meta, Store
from nezha.config import CacheSettings, Origin
from nezha.errors import FillAborted, NezhaError, OriginError, OriginTimeout

log = structlog.get_logger("nezha.cachenode")

CACHE_HEADER = "X-Nezha-Cache"
ADMIN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_SENDFILE = os.environ.get("AIOHTTP_NOSENDFILE") is None  # aiohttp's own switch, honoured alike


class LeaderGone(FillAborted):
    """The request leading a flight ended before the origin answered."""


class BrokenStream(Exception):
    """A body could not be completed; the connection was closed on purpose."""


def _kept(headers: "aiohttp.typedefs.LooseHeaders") -> dict[str, str]:
    return {h: headers[h] for h in KEPT_HEADERS if h in headers}


class CacheNode:
    def __init__(self, *, settings: CacheSettings, store: Store, origins: OriginClient,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.origins = origins
        self.metrics = metrics or Metrics()
        self.flights = Flights()
        self._table = settings.origin_table
        self._clock = clock
        self._tasks: set[asyncio.Task] = set()
        self._ready = False

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        await self.store.open()
        await self.origins.start()
        self._update_store_gauges()
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.origins.close()

    async def settled(self) -> None:
        """Wait for fills and other background work in progress to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def on_evict(self, meta: Meta) -> None:
        self.metrics.evictions.inc()
        self._update_store_gauges()

    def _update_store_gauges(self) -> None:
        self.metrics.stored_bytes.set(self.store.used_bytes)
        self.metrics.stored_objects.set(len(self.store))

    # -- entry point -----------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        host_header = request.headers.get("Host")
        if request.raw_path in ADMIN_PATHS and not self._names_origin(host_header):
            return await self._admin(request)
        try:
            target = parse_target(request.raw_path, host_header)
        except BadTarget as e:
            raise web.HTTPBadRequest(text=f"bad request: {e}\n")
        request["host"] = target.host
        origin = self._table.get(target.host)
        if origin is None:
            raise web.HTTPForbidden(
                text=f"host {target.host!r} is not a configured origin; this cache is not an open proxy\n")
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(
                request.method, ["GET", "HEAD"], text=f"method {request.method} is not served; use GET or HEAD\n")
        url = origin.upstream + target.path_qs
        key = cache_key(target, volatile_params=origin.volatile_params)
        request["key"] = key
        bypass = request_bypasses_cache(request.headers)
        if bypass is not None:
            return await self._pass(request, url, label="bypass")
        if request.method == "HEAD":
            meta = self.store.lookup(key)
            if meta is not None and meta.fresh(self._clock()):
                return await self._serve_hit(request, meta, label="hit")
            return await self._pass(request, url, label="pass")
        return await self._get(request, key=key, url=url, origin=origin, target=target)

    def _names_origin(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        return host_header.rsplit(":", 1)[0].lower().rstrip(".") in self._table

    async def _admin(self, request: web.Request) -> web.Response:
        request["cache"] = "admin"
        if request.raw_path == "/healthz":
            return web.Response(text="ok\n")
        if request.raw_path == "/readyz":
            detail = {"ready": self._ready, "objects": len(self.store), "bytes": self.store.used_bytes,
                      "fills_in_flight": len(self.flights)}
            return web.json_response(detail, status=200 if self._ready else 503)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    # -- GET ---------------------------------------------------------------------
    async def _get(self, request: web.Request, *, key: str, url: str, origin: Origin,
                   target: Target) -> web.StreamResponse:
        # A joiner whose leader vanished retries; bounded so a pathological
        # origin cannot keep a request looping.
        for _ in range(5):
            meta = self.store.lookup(key)
            if meta is not None and meta.fresh(self._clock()):
                served = await self._serve_hit(request, meta, label="hit")
                if served is not None:
                    return served
                continue  # evicted between lookup and open
            flight, leader = self.flights.lead_or_join(key)
            response: aiohttp.ClientResponse | None = None
            if leader:
                outcome, response = await self._lead(flight, key=key, url=url, origin=origin,
                                                     stale=meta, target=target)
            else:
                outcome = await asyncio.shield(flight.outcome)
            if outcome.kind is Kind.STREAMING:
                assert outcome.fill is not None
                return await self._serve_fill(request, outcome.fill, label="miss" if leader else "miss-joined")
            if outcome.kind is Kind.REVALIDATED:
                assert outcome.meta is not None
                served = await self._serve_hit(request, outcome.meta, label="revalidated")
                if served is not None:
                    return served
                continue
            if outcome.kind is Kind.PASSED:
                return await self._pass(request, url, label="pass", response=response)
            error = outcome.error
            if isinstance(error, LeaderGone):
                continue
            if meta is not None and meta.stale_if_error:
                log.warning("serving_stale", key=key, error=str(error))
                served = await self._serve_hit(request, meta, label="stale", stale_reason=str(error))
                if served is not None:
                    return served
            raise self._origin_failure(error)
        raise web.HTTPServiceUnavailable(text=f"gave up on {key}: the origin exchange kept restarting\n")

    @staticmethod
    def _origin_failure(error: NezhaError | None) -> web.HTTPException:
        if isinstance(error, OriginTimeout):
            return web.HTTPGatewayTimeout(text=f"{error}\n")
        return web.HTTPBadGateway(text=f"{error}\n")

    async def _lead(self, flight: Flight, *, key: str, url: str, origin: Origin, stale: Meta | None,
                    target: Target) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        """Ask the origin once for everybody waiting on `key`."""
        headers: dict[str, str] = {}
        if stale is not None:
            if stale.etag:
                headers["If-None-Match"] = stale.etag
            if stale.last_modified:
                headers["If-Modified-Since"] = stale.last_modified
        what = f"origin {url}"
        response: aiohttp.ClientResponse | None = None
        try:
            try:
                response = await self.origins.request("GET", url, headers=headers, what=what)
            except OriginError as e:
                self.flights.land(flight)
                self._count(fill_failures=1)
                outcome = Outcome(Kind.FAILED, error=e)
                flight.resolve(outcome)
                return outcome, None
            now = self._clock()
            policy = response_policy(response.status, response.headers, default_ttl=origin.default_ttl, now=now)
            if response.status == 304 and stale is not None:
                response.release()
                ttl = response_policy(200, {**stale.headers, **_kept(response.headers)},
                                      default_ttl=origin.default_ttl, now=now).ttl
                meta = await self.store.refresh(stale, headers=_kept(response.headers), expires_at=now + ttl)
                self.flights.land(flight)
                outcome = Outcome(Kind.REVALIDATED, meta=meta)
                flight.resolve(outcome)
                return outcome, None
            if response.status >= 500 and stale is not None and stale.stale_if_error:
                response.release()
                self.flights.land(flight)
                outcome = Outcome(Kind.FAILED, error=OriginError(f"{what} returned {response.status}"))
                flight.resolve(outcome)
                return outcome, None
            length = response.content_length
            if not policy.storable or (length is not None and not self.store.fits(length)):
                reason = policy.reason if not policy.storable else f"{length} bytes exceed capacity"
                log.info("response_not_stored", key=key, reason=reason)
                self.flights.land(flight)
                outcome = Outcome(Kind.PASSED)
                flight.resolve(outcome)
                return outcome, response
            fill = await self._start_fill(flight, response, key=key, url=url, host=target.host,
                                          ttl=policy.ttl, stale_if_error=policy.stale_if_error, now=now)
            response = None  # the fill owns it now
            outcome = Outcome(Kind.STREAMING, fill=fill)
            flight.resolve(outcome)
            return outcome, None
        except BaseException as e:
            if response is not None:
                response.release()
            if not flight.outcome.done():
                self.flights.abort(flight, LeaderGone(f"request leading the fetch of {key} ended: {e!r}"))
            raise

    async def _start_fill(self, flight: Flight, response: aiohttp.ClientResponse, *, key: str, url: str,
                          host: str, ttl: float, stale_if_error: bool, now: float) -> Fill:
        length = response.content_length
        try:
            temp = await self.store.new_temp()
        except NezhaError:
            response.release()
            raise
        temp.reserved = length or 0
        self.store.reserve(temp.reserved)
        kept = _kept(response.headers)
        fill = Fill(key=key, headers=kept, length=length, temp=temp)
        meta = Meta(key=key, url=url, host=host, size=0, headers=kept, stored_at=now,
                    expires_at=now + ttl, stale_if_error=stale_if_error)
        self._count(misses=1)
        self.metrics.fills_in_flight.inc()

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_chunked(self.settings.chunk_size):
                    yield chunk
            finally:
                response.release()

        async def work() -> Meta:
            started = time.monotonic()
            try:
                stored = await fill.run(body(), store=self.store, meta=meta,
                                        on_bytes=lambda n: self.metrics.bytes_from_origin.inc(n))
            except NezhaError:
                self._count(fill_failures=1)
                raise
            finally:
                self.metrics.fills_in_flight.dec()
            self._update_store_gauges()
            log.info("fill_completed", key=key, bytes=stored.size,
                     seconds=round(time.monotonic() - started, 3))
            return stored

        task = asyncio.get_running_loop().create_task(run_fill_in_background(self.flights, flight, work()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return fill

    def _count(self, **deltas: int) -> None:
        m = self.metrics
        for name, value in deltas.items():
            if name == "hits":
                m.hits.inc(value)
            elif name == "misses":
                m.misses.inc(value)
            elif name == "bytes_from_disk":
                m.bytes_from_disk.inc(value)
            elif name == "fill_failures":
                m.fill_failures.inc(value)

    # -- responses -------------------------------------------------------------
    def _object_headers(self, resp: web.StreamResponse, headers: dict[str, str], label: str) -> None:
        for name, value in headers.items():
            resp.headers[name] = value
        resp.headers["Accept-Ranges"] = "bytes"
        resp.headers[CACHE_HEADER] = label

    async def _serve_hit(self, request: web.Request, meta: Meta, *, label: str,
                         stale_reason: str | None = None) -> web.StreamResponse | None:
        """Send a stored object; None if it vanished (evicted or replaced) first."""
        loop = asyncio.get_running_loop()
        try:
            f = await loop.run_in_executor(None, open, self.store.data_path(meta), "rb")
        except FileNotFoundError:
            return None
        try:
            request["cache"] = label
            decision = evaluate(request.headers, size=meta.size, etag=meta.etag, last_modified=meta.last_modified)
            resp = web.StreamResponse(status=decision.outcome.value)
            self._object_headers(resp, meta.headers, label)
            if stale_reason is not None:
                resp.headers["Warning"] = '111 - "Revalidation Failed"'
            if decision.outcome is RangeOutcome.NOT_MODIFIED or decision.outcome is RangeOutcome.PRECONDITION_FAILED:
                for h in ("Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition"):
                    resp.headers.popall(h, None)
                resp.content_length = 0 if decision.outcome is RangeOutcome.PRECONDITION_FAILED else None
                await resp.prepare(request)
                await resp.write_eof()
                self._count(hits=1)
                return resp
            if decision.outcome is RangeOutcome.UNSATISFIABLE:
                resp.headers["Content-Range"] = f"bytes */{meta.size}"
                resp.content_length = 0
                await resp.prepare(request)
                await resp.write_eof()
                return resp
            if decision.outcome is RangeOutcome.PARTIAL:
                end = decision.start + decision.length - 1
                resp.headers["Content-Range"] = f"bytes {decision.start}-{end}/{meta.size}"
            resp.content_length = decision.length
            self._count(hits=1)
            await resp.prepare(request)
            if request.method != "HEAD" and decision.length:
                await self._send_file(request, resp, f, decision.start, decision.length)
                self._count(bytes_from_disk=decision.length)
                request["bytes"] = decision.length
            await resp.write_eof()
            return resp
        finally:
            f.close()

    async def _send_file(self, request: web.Request, resp: web.StreamResponse, f: IO[bytes],
                         offset: int, count: int) -> None:
        """Bytes [offset, offset+count) of `f` to the client, by sendfile when possible."""
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        if _SENDFILE and resp.chunked is False and not resp.compression:
            try:
                sent = await asyncio.get_running_loop().sendfile(transport, f, offset, count)
            except NotImplementedError:
                pass
            else:
                if sent != count:
                    raise BrokenStream(f"sent {sent} of {count} bytes")
                return
        loop = asyncio.get_running_loop()
        chunk = self.settings.chunk_size
        while count > 0:
            data = await loop.run_in_executor(None, os.pread, f.fileno(), min(chunk, count), offset)
            if not data:
                raise BrokenStream(f"file ended {count} bytes early")
            await resp.write(data)
            offset += len(data)
            count -= len(data)

    async def _serve_fill(self, request: web.Request, fill: Fill, *, label: str) -> web.StreamResponse:
        """Stream an object while the origin is still sending it."""
        loop = asyncio.get_running_loop()
        f = await loop.run_in_executor(None, self._open_fill, fill)
        try:
            request["cache"] = label
            size = fill.length
            start, length = 0, size
            status = 200
            resp = web.StreamResponse()
            self._object_headers(resp, fill.headers, label)
            if size is not None:
                decision = evaluate(request.headers, size=size, etag=fill.headers.get("ETag"),
                                    last_modified=fill.headers.get("Last-Modified"))
                if decision.outcome is RangeOutcome.PARTIAL:
                    status, start, length = 206, decision.start, decision.length
                    resp.headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{size}"
                elif decision.outcome is RangeOutcome.UNSATISFIABLE:
                    resp.set_status(416)
                    resp.headers["Content-Range"] = f"bytes */{size}"
                    resp.content_length = 0
                    await resp.prepare(request)
                    await resp.write_eof()
                    return resp
                resp.content_length = length
            else:
                resp.enable_chunked_encoding()
            resp.set_status(status)
            await resp.prepare(request)
            offset = start
            end = None if length is None else start + length
            try:
                while end is None or offset < end:
                    available = await fill.wait_beyond(offset)
                    if end is not None:
                        available = min(available, end)
                    if available <= offset:
                        break  # unknown length and the fill is complete
                    await self._send_file(request, resp, f, offset, available - offset)
                    offset = available
            except (FillAborted, BrokenStream) as e:
                request["cache"] = f"{label}-aborted"
                log.warning("stream_aborted", key=fill.key, sent=offset - start, error=str(e))
                self._break(request)
                return resp
            request["bytes"] = offset - start
            await resp.write_eof()
            return resp
        finally:
            f.close()

    def _open_fill(self, fill: Fill) -> IO[bytes]:
        # The temp file is renamed when the fill commits; fall back to its new name.
        try:
            return open(fill.temp.path, "rb")
        except FileNotFoundError:
            if fill.meta is None:
                raise
            return open(self.store.data_path(fill.meta), "rb")

    @staticmethod
    def _break(request: web.Request) -> None:
        """Close the connection mid-body: the client must see an error, not a short object."""
        request["broken"] = True
        if request.transport is not None:
            request.transport.abort() if hasattr(request.transport, "abort") else request.transport.close()

    async def _pass(self, request: web.Request, url: str, *, label: str,
                    response: aiohttp.ClientResponse | None = None) -> web.StreamResponse:
        """Copy the origin's answer to this one client; store nothing."""
        request["cache"] = label
        if response is None:
            headers = end_to_end(request.headers)
            try:
                response = await self.origins.request(request.method, url, headers=headers, what=f"origin {url}")
            except OriginError as e:
                raise self._origin_failure(e)
        try:
            resp = web.StreamResponse(status=response.status, reason=response.reason)
            for name, value in end_to_end(response.headers).items():
                resp.headers.add(name, value)
            resp.headers[CACHE_HEADER] = label
            if response.content_length is not None:
                resp.content_length = response.content_length
            elif request.method != "HEAD" and response.status not in (204, 304):
                resp.enable_chunked_encoding()
            await resp.prepare(request)
            sent = 0
            if request.method != "HEAD":
                try:
                    async for chunk in response.content.iter_chunked(self.settings.chunk_size):
                        await resp.write(chunk)
                        sent += len(chunk)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    log.warning("pass_aborted", url=url, sent=sent, error=f"{type(e).__name__}: {e}")
                    self._break(request)
                    return resp
            request["bytes"] = sent
            await resp.write_eof()
            return resp
        finally:
            response.release()


@web.middleware
async def access_log(request: web.Request, handler) -> web.StreamResponse:
    """One `request_completed` line per request, with the cache outcome."""
    started = time.monotonic()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        request.setdefault("cache", "refused" if status in (400, 403, 405) else "error")
        raise
    finally:
        fields = {"method": request.method, "host": request.get("host"), "path": request.path[:300],
                  "status": status, "cache": request.get("cache"), "bytes": request.get("bytes", 0),
                  "ms": round((time.monotonic() - started) * 1000, 2)}
        if request.get("broken"):
            fields["broken"] = True
        log.info("request_completed", **fields)
