"""An origin's interim answers, passed on to the client they are for (RFC 9110 §15.2).

A 103 (Early Hints) lets a client start on what it will need before the
final answer; a 102 says the origin is still working. aiohttp's client drops
both (`cachenode/fill/origin.py` `InterimResponse` hears them first), and a
cache that drops them hides what the origin meant for its client.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from cachenode.front.exact_head import encode_head
from cachenode.http.headers import end_to_end_pairs


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
