"""A fill spliced from its socket that breaks off mid-body goes on from the byte its file reached
(cachenode/fill/buffer.py `Fill.run_spliced`'s `rest`): how a streaming copy whose source dies keeps its
readers whole (cluster/streaming_copies.py) without passing every byte through Python.

A real socket that a server cuts after part of the body, so the break is the kernel's, as when a node is
killed: the splice sees the peer close with bytes to go.
"""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp
import pytest
from aiohttp import web

from cachenode.fill.buffer import Fill
from cachenode.fill.running import BROKE
from cachenode.kernel import splice
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.errors import FillAborted

MiB = 1 << 20
BODY = os.urandom(4 * MiB)
CUT = 3 * MiB // 2 + 12345  # not on any page or pipe boundary
KEY = "http://datasets.example/cut.bin"


async def cut_server(aiohttp_server):
    """Announces the whole body, sends CUT bytes of it, then drops the connection."""
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"ETag": '"v1"'})
        resp.content_length = len(BODY)
        await resp.prepare(request)
        await resp.write(BODY[:CUT])
        await asyncio.sleep(0.2)  # the bytes reach the reader before the cut
        request.transport.abort()
        return resp

    app = web.Application()
    app.router.add_get("/cut", handle)
    return await aiohttp_server(app, host="127.0.0.1")


async def spliced_fill(server, store: Store, *, rest, broke=BROKE) -> tuple[Fill, Meta | BaseException]:
    now = time.time()
    meta = Meta(key=KEY, url=KEY, host="datasets.example", size=0, headers={}, stored_at=now, expires_at=now + 60)
    async with aiohttp.ClientSession(read_bufsize=64 * 1024) as session:
        response = await session.get(server.make_url("/cut"))
        body = splice.take(response)
        if body is None:
            pytest.fail("this loop and platform should let a fill splice its body")
        fill = Fill(key=KEY, headers={}, length=len(BODY), write=await store.writing(reserve=len(BODY)).open())
        try:
            return fill, await fill.run_spliced(body, store=store, meta=meta, read_timeout=10, rest=rest, broke=broke)
        except BaseException as e:  # noqa: BLE001 - the outcome is what the test looks at
            return fill, e


async def test_a_spliced_fill_whose_socket_breaks_takes_the_rest_from_the_byte_its_file_reached(
        aiohttp_server, tmp_path):
    server = await cut_server(aiohttp_server)
    store = Store(tmp_path / "s", small_max=0)  # the large format: a data file of its own
    await store.open()
    asked: list[tuple[int, str]] = []

    async def rest(offset: int, error: BaseException):
        asked.append((offset, type(error).__name__))
        for at in range(offset, len(BODY), 300_000):
            yield BODY[at:at + 300_000]

    fill, outcome = await spliced_fill(server, store, rest=rest)
    assert isinstance(outcome, Meta) and outcome.size == len(BODY), outcome
    assert asked == [(CUT, "ClientPayloadError")], "asked once, from exactly the byte the socket gave last"
    with open(store.data_path(outcome), "rb") as f:
        assert f.read() == BODY


async def test_without_a_rest_the_spliced_fill_fails_and_stores_nothing(aiohttp_server, tmp_path):
    server = await cut_server(aiohttp_server)
    store = Store(tmp_path / "s")
    await store.open()
    fill, outcome = await spliced_fill(server, store, rest=None)
    assert isinstance(outcome, FillAborted), outcome
    assert KEY not in store and list(store.tmp.iterdir()) == []
