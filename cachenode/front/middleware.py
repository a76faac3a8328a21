"""The node's aiohttp middlewares: the methods refused before routing, and
the one `request_completed` line per request, with its cache outcome, which
is also when the request is counted on /metrics."""

from __future__ import annotations

import time

import structlog
from aiohttp import web

from typing import Callable

from cachenode.front.access import access
from cachenode.metrics import Metrics
from nezha.wire import CacheOutcome

log = structlog.get_logger("nezha.cachenode")

# Methods whose purpose is to read (RFC 9110 §9.2.1); any other, known or not,
# may change the resource, and a success invalidates it (RFC 9111 §4.4).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# Refused: CONNECT would make the cache a tunnel to anywhere, TRACE would
# echo to the origin's side what clients sent the cache (credentials included).
REFUSED_METHODS = {
    "CONNECT": "this cache is not a tunnel; clients reach HTTPS hosts without CONNECT",
    "TRACE": "the cache does not echo requests",
}
ALLOWED_METHODS = sorted(SAFE_METHODS - {"TRACE"} | {"POST", "PUT", "DELETE", "PATCH"})


@web.middleware
async def refuse_methods(request: web.Request, handler) -> web.StreamResponse:
    """CONNECT and TRACE are refused before routing: a CONNECT's target
    (`host:443`) is no path, and would otherwise be a puzzling 404. The node
    answers an OPTIONS itself when it is the last hop it may travel
    (`Max-Forwards: 0`, RFC 9110 §7.6.2) or asks about the server as a whole
    (`OPTIONS *`, §9.3.7)."""
    if request.method in REFUSED_METHODS:
        if request.method == "CONNECT":
            # The target (authority-form, RFC 9110 §9.3.6) is where the client asked
            # to go, so it is what the request's line names, not its Host field.
            record = access(request)
            record.host, record.port = request.url.host, request.url.explicit_port
        else:  # TRACE names its host as every other request does: in its Host field
            access(request).host = request.url.host
        raise web.HTTPMethodNotAllowed(
            request.method, ALLOWED_METHODS,
            text=f"method {request.method} is refused: {REFUSED_METHODS[request.method]}\n")
    if request.method == "OPTIONS" and (request.raw_path == "*"
                                        or request.headers.get("Max-Forwards", "").strip() == "0"):
        access(request).cache = "options"
        return web.Response(status=200, headers={"Allow": ", ".join(ALLOWED_METHODS)})
    return await handler(request)


@web.middleware
async def access_log(request: web.Request, handler) -> web.StreamResponse:
    """One `request_completed` line per request, with the cache outcome."""
    started = time.monotonic()
    record = access(request)
    record.started = started
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        if record.cache is None:
            record.cache = CacheOutcome.REFUSED if status in (400, 403, 405) else CacheOutcome.ERROR
        raise
    finally:
        fields = {"method": request.method, "host": record.host, "path": request.path[:300], "status": status,
                  "cache": record.cache, "bytes": record.bytes, "ms": round((time.monotonic() - started) * 1000, 2)}
        if record.broken:
            fields["broken"] = True
        if record.peer:
            fields["peer"] = record.peer
        if record.port is not None:
            fields["port"] = record.port
        metrics = request.app.get(METRICS)
        if metrics is not None:
            metrics.requests.labels(cache=record.cache or "none").inc()
            from_peer = request.app.get(FROM_PEER)
            if from_peer is None or not from_peer(request):
                metrics.served(record.cache, record.bytes, first_byte=record.first_byte)
        log.info("request_completed", **fields)


async def head_prepared(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the response head is ready, which is the request's time to first byte."""
    record = access(request)
    if record.started is not None and record.first_byte is None:
        record.first_byte = time.monotonic() - record.started


# The metrics access_log counts every request in, set by the app that installs it.
METRICS = web.AppKey("nezha_metrics", Metrics)
# Whether a request is a peer's (cachenode/peers/auth.py): its bytes are the relaying node's to count.
FROM_PEER = web.AppKey("nezha_from_peer", Callable[[web.Request], bool])
