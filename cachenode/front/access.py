"""The per-request record behind the one `request_completed` log line.

Handlers fill it in as they decide (host, key, cache outcome, bytes, peer);
the access-log middleware writes it out once, whatever the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from nezha.keys import Target


@dataclass
class Access:
    host: str | None = None
    port: int | None = None  # a CONNECT's target port; other requests' host says where they go
    key: str | None = None
    cache: str | None = None
    bytes: int = 0
    peer: str | None = None
    broken: bool = False
    started: float | None = None  # time.monotonic() when the middlewares took the request
    first_byte: float | None = None  # seconds from then to the response head (cachenode/metrics.py)


ACCESS = web.RequestKey("nezha_access", Access)
# The target this request's origin requests ask the node's parent tier for
# (cachenode/fill/upstream.py), set once by the handler; unset: the origin itself.
PARENT_ROUTE = web.RequestKey("nezha_parent_route", Target)


def access(request: web.Request) -> Access:
    record = request.get(ACCESS)
    if record is None:
        record = request[ACCESS] = Access()
    return record


def parent_route(request: web.Request) -> Target | None:
    return request.get(PARENT_ROUTE)


def break_connection(request: web.Request) -> None:
    """Close the connection mid-body: the client must see an error, not a short object."""
    access(request).broken = True
    if request.transport is not None:
        request.transport.abort()
