"""A fill that takes a response's socket for splice gets the whole body even
when aiohttp holds all of it already (cachenode/kernel/splice.py).

Found by the signed S3 tests (issue 22): a body larger than the reader's
buffer had arrived whole before the fill took the socket. Draining the
buffer let aiohttp's parser resume, it reached the end of the body, and
aiohttp handed the connection back to its pool; the fill then paused a
transport it no longer had (`fill_crashed`), its client getting a 200 and
no byte.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
from aiohttp import web

from cachenode.kernel import splice

BODY = os.urandom(200 * 1024)  # in one read of the socket, more than the reader buffer holds


async def test_a_body_that_arrived_whole_is_handed_over_whole_and_its_pooled_connection_untouched(
        aiohttp_server, tmp_path):
    app = web.Application()
    app.router.add_get("/whole", lambda request: web.Response(body=BODY))
    server = await aiohttp_server(app, host="127.0.0.1")
    # A reader buffer smaller than the body, as the node's origin client has for large bodies.
    async with aiohttp.ClientSession(read_bufsize=64 * 1024) as session:
        response = await session.get(server.make_url("/whole"))
        await asyncio.sleep(0.5)  # the rest of the body reaches this side and waits, unparsed, in aiohttp
        body = splice.take(response)
        assert body is not None
        target = tmp_path / "body"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, body.buffered, 0)
            if body.remaining:
                await body.pump_into(fd, len(body.buffered), end=lambda: len(BODY), moved=lambda n: None,
                                     read_timeout=10)
        finally:
            body.close()
            os.close(fd)
        assert target.read_bytes() == BODY
        # Whatever became of that connection, the next request through the pool works.
        async with session.get(server.make_url("/whole")) as again:
            assert await again.read() == BODY


async def test_a_relayed_body_that_arrived_whole_leaves_its_pooled_connection_usable(aiohttp_server):
    """The relay's splice (`splice_body`) met the same end of body: it paused
    the connection aiohttp had just pooled, and the next request on it hung."""
    origin = web.Application()
    origin.router.add_get("/whole", lambda request: web.Response(body=BODY))
    upstream = await aiohttp_server(origin, host="127.0.0.1")
    session = aiohttp.ClientSession(read_bufsize=64 * 1024,
                                    connector=aiohttp.TCPConnector(limit=1))  # one connection, reused

    async def relay(request: web.Request) -> web.StreamResponse:
        response = await session.get(upstream.make_url("/whole"))
        await asyncio.sleep(0.5)  # the whole body reaches this side
        out = web.StreamResponse()
        out.content_length = response.content_length
        await out.prepare(request)
        await splice.splice_body(response, request, out, read_timeout=10, on_bytes=lambda n: None)
        return out

    front = web.Application()
    front.router.add_get("/whole", relay)
    server = await aiohttp_server(front, host="127.0.0.1")
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(server.make_url("/whole")) as r:
                assert await r.read() == BODY
        async with session.get(upstream.make_url("/whole"), timeout=aiohttp.ClientTimeout(total=10)) as again:
            assert await again.read() == BODY
    finally:
        await session.close()
