"""A pass-through's exchange with the origin: the client's request sent on as
it came, and the head the client's answer gets from the origin's.

Apart from `respond.py`'s copying of the body: these two decide what crosses
the cache in each direction (end-to-end fields, Via, the body's framing),
the copy only moves bytes.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from cachenode.fill.origin import add_via, end_to_end, forwarded_request_headers
from cachenode.fill.upstream import Upstream
from cachenode.front.access import parent_route
from cachenode.front.exact_head import ExactResponse
from cachenode.front.interim import CONTINUE_DEFERRED, InterimRelay, continued
from cachenode.front.short_answers import origin_failure
from nezha.errors import OriginError
from nezha.wire import CACHE_HEADER


async def ask_origin(upstream: Upstream, request: web.Request, url: str, *, via: str) -> aiohttp.ClientResponse:
    """The client's request, as sent, to the origin (or the parent tier):
    every end-to-end field, and the body streamed with its own framing."""
    deferred = request.get(CONTINUE_DEFERRED, False)
    headers = forwarded_request_headers(request.headers, via=via, expect=deferred)
    data = None
    if request.body_exists:
        # Streamed with the client's framing: a known length goes on as
        # Content-Length (object stores refuse chunked uploads), else chunked.
        data = continued(request) if deferred else request.content
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
    interim = InterimRelay(request)
    try:
        return await upstream.request(request.method, url, headers=headers, what=f"origin {url}",
                                      route=parent_route(request), data=data, interim=interim)
    except OriginError as e:
        raise origin_failure(e)
    finally:
        interim.close()


def passed_head(request: web.Request, response: aiohttp.ClientResponse, *, label: str,
                via: str | None) -> ExactResponse:
    """The origin's status and end-to-end fields, with this node's Via
    (`via`; none to a peer) and X-Nezha-Cache."""
    resp = ExactResponse(status=response.status, reason=response.reason)
    for name, value in end_to_end(response.headers).items():
        resp.headers.add(name, value)
    if via is not None:
        add_via(resp.headers, via)
    resp.headers[CACHE_HEADER] = label
    if response.content_length is not None:
        resp.content_length = response.content_length
    elif request.method != "HEAD" and response.status not in (204, 304):
        resp.enable_chunked_encoding()
    return resp
