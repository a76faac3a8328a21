"""An origin's interim answers, passed on to the client they are for (RFC 9110 §15.2).

A 103 (Early Hints) lets a client start on what it will need before the
final answer; a 102 says the origin is still working. aiohttp's client drops
both (`cachenode/fill/origin.py` `InterimResponse` hears them first), and a
cache that drops them hides what the origin meant for its client. The 100
Continue a client waits for before it sends a body is the node's own, or,
for a request passed to the origin, the origin's (`CONTINUE_DEFERRED`).
"""

from __future__ import annotations

from typing import AsyncIterator

import aiohttp
from aiohttp import web

from cachenode.front.exact_head import encode_head
from cachenode.http.headers import end_to_end_pairs

# Set on a request whose `Expect: 100-continue` the node did not answer: the
# origin's own 100 (or its refusal) reaches the client instead.
CONTINUE_DEFERRED = web.RequestKey("nezha_continue_deferred", bool)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def send_continue(request: web.Request) -> None:
    """The interim 100 that lets a client send its body (RFC 9110 §15.2.1)."""
    await request.writer.write(_CONTINUE)
    request.writer.output_size = 0  # the response proper has not started


async def continued(request: web.Request) -> AsyncIterator[bytes]:
    """The client's body, asked for only once the origin said 100 Continue.

    aiohttp's client pulls the first chunk only after the origin's 100
    (it waits on it for a request with Expect), and that pull is when the
    client hears 100 too; a final answer instead (403, 307) reaches the
    client before it sent any of a body it need not send.
    """
    await send_continue(request)
    async for chunk in request.content.iter_any():
        yield chunk


class InterimRelay:
    """Forwards an origin's interim answers (102, 103 Early Hints) to the one
    client whose request the origin is answering (RFC 9110 §15.2).

    Only before that client's response has begun, never to an HTTP/1.0
    client (§15.2 forbids it), and only while open: the caller closes it as
    soon as the origin's final answer is in, so a later exchange (a
    background revalidation, a parallel range) never writes into a response
    already under way. Their end-to-end fields go as they came; nothing of
    them is stored.
    """

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._open = request.version >= aiohttp.HttpVersion11

    def close(self) -> None:
        self._open = False

    async def __call__(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        writer = self._request.writer
        if not self._open or writer.output_size:
            return
        try:
            await writer.write(encode_head(f"HTTP/1.1 {status} {reason}", end_to_end_pairs(headers)))
        except ConnectionError:
            self._open = False
            return
        writer.output_size = 0  # the response proper has not started
