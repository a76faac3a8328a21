"""The per-request record behind the one `request_completed` log line.

Handlers fill it in as they decide (host, key, cache outcome, bytes, peer);
the access-log middleware writes it out once, whatever the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass
class Access:
    host: str | None = None
    key: str | None = None
    cache: str | None = None
    bytes: int = 0
    peer: str | None = None
    broken: bool = False


ACCESS = web.RequestKey("nezha_access", Access)


def access(request: web.Request) -> Access:
    record = request.get(ACCESS)
    if record is None:
        record = request[ACCESS] = Access()
    return record


def break_connection(request: web.Request) -> None:
    """Close the connection mid-body: the client must see an error, not a short object."""
    access(request).broken = True
    if request.transport is not None:
        request.transport.abort()
