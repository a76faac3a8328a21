"""The rest of a relayed body that broke with no owner ahead left to give it.

When the filling owner dies under a stampede, every client relayed from it
breaks at once. Those relayed through a non-owner resume from the next
owner (front/relay.py's loop), whose flight serves them all. Those relayed
through that next owner itself join the same flight: the node asks itself
for the rest (as a peer would, so the request meets the flight like any
other) before it would ask the origin. So the origin gets one resume for
the missing range, not one per client, and the flight keeps what it
fetched (cachenode/fill/parallel.py, a fill led by a resume). Only when
neither this node's flight nor the origin can give the rest is the
client's connection cut: never a short body.

Every resume asks for `Range: bytes=<sent>-<end>` pinned by `If-Range`
(`RelayedBody.resume_headers`), and takes only an answer that is exactly
that rest (`RelayedBody.continues`).
"""

from __future__ import annotations

import asyncio

import aiohttp
import structlog
from aiohttp import web

from cachenode.kernel import splice
from cachenode.front.access import break_connection
from nezha.ring import Peer
from cachenode.front.peer_link import PeerLink
from cachenode.front.relay_body import RelayedBody, client_gone, finish_body, stream_body
from nezha.keys import Target
from cachenode.fill.origin import forwarded_request_headers, via_of
from nezha.errors import OriginError

log = structlog.get_logger("nezha.peers")

# What a resume logs, by where the rest came from: (resumed, refused, failed).
_RESUME_EVENTS = {"origin": ("origin_resumed", "origin_resume_refused", "origin_resume_failed"),
                  "here": ("resumed_here", "resume_here_refused", "resume_here_failed")}
_CONDITIONALS = ("If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since", "If-Range", "Range")


def headers_for(link: PeerLink, request: web.Request, target: Target, *, validators: dict[str, str] | None,
                body: RelayedBody | None):
    """The fields an owner is asked with: a hot copy's validators instead of
    the client's on the first ask, a resumed body's range on a later one."""
    headers = link.peer_headers(request, target)
    if validators is not None and body is None:
        for name in ("If-None-Match", "If-Modified-Since"):
            headers.popall(name, None)
        headers.update(validators)
    if body is not None:
        for name in _CONDITIONALS:
            headers.popall(name, None)
        headers.update(body.resume_headers())
    return headers


async def unfinished(link: PeerLink, request: web.Request, body: RelayedBody, *, origin_url: str | None,
                     target: Target, here: Peer | None = None) -> web.StreamResponse:
    """No owner finished the body it began: the rest from this node's own
    flight when it owns the key, else from the origin, else a broken connection."""
    if here is not None and body.resumable and request.method == "GET":
        try:
            if await resume(link, request, body, url=here.url + target.path_qs, target=target,
                            headers=headers_for(link, request, target, validators=None, body=body), source=here):
                return await finish_body(link, request, body, target)
        except splice.ClientGone as e:
            return client_gone(request, body, here.id, e)
    if origin_url is not None and body.resumable and request.method == "GET":
        try:
            if await resume_from_origin(link, request, body, origin_url, target):
                return await finish_body(link, request, body, target)
        except splice.ClientGone as e:
            return client_gone(request, body, "origin", e)
    # Headers are out and nothing could finish the body: the client must
    # see a broken response, never a short one.
    log.warning("relay_broken", path=target.path, sent=body.sent, resumable=body.resumable)
    break_connection(request)
    return body.out


async def resume_from_origin(link: PeerLink, request: web.Request, body: RelayedBody, url: str,
                             target: Target) -> bool:
    """Fetch the rest of the body from the origin; False if it cannot be had."""
    headers = forwarded_request_headers(request.headers, via=via_of(link.node_id))
    for name in _CONDITIONALS:
        headers.popall(name, None)
    headers.update(body.resume_headers())
    return await resume(link, request, body, url=url, headers=headers, target=target, source=None)


async def resume(link: PeerLink, request: web.Request, body: RelayedBody, *, url: str, headers, target: Target,
                 source: Peer | None) -> bool:
    """The rest of the body from `url` (the origin, or `source`: this node's own
    flight, asked as a peer asks); False if it cannot be had there."""
    offset = body.start + body.sent
    resumed, refused, failed = _RESUME_EVENTS["origin" if source is None else "here"]
    try:
        if source is None:
            r = await link.client.request("GET", url, headers=headers, what=f"origin {url}")
        else:
            r = await link.ask(source, "GET", url, headers=headers)
    except OriginError as e:
        log.warning(failed, path=target.path, offset=offset, error=str(e))
        return False
    try:
        if not body.continues(r):
            log.warning(refused, path=target.path, offset=offset, status=r.status,
                        content_range=r.headers.get("Content-Range"))
            return False
        log.info(resumed, path=target.path, offset=offset)
        try:
            await stream_body(link, request, r, body, peer=None)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.warning(failed, path=target.path, offset=offset, sent=body.sent,
                        error=f"{type(e).__name__}: {e}")
            return False
        return True
    finally:
        r.release()
