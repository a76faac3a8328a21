"""The controller's batches of fills (controller/prefetch_batches.py): what it makes of a node's answers,
and of a node that cannot answer them (one without `/_nezha/prefetch`, one that goes away)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from controller.prefetch_batches import FillBatches


class FakeNode:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.status = 200
        self.hang_up = False
        self.slow: str | None = None  # a URL answered only after a second

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.status != 200:
            return web.Response(status=self.status, text="no such endpoint\n")
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for url in body["urls"]:
            if url == self.slow:
                await asyncio.sleep(1.0)
            if self.hang_up and url.endswith("/late"):
                request.transport.close()
                return resp
            await resp.write(b"\n" + json.dumps({"url": url, "stored": len(url)}).encode() + b"\n")
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp


@pytest.fixture
async def fake(aiohttp_server):
    node = FakeNode()
    app = web.Application()
    app.router.add_post("/_nezha/prefetch", node.handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    async with aiohttp.ClientSession() as session:
        node.batches = FillBatches(url=f"http://127.0.0.1:{server.port}/_nezha/prefetch", session=lambda: session,
                                   headers={"X-Nezha-Token": "t"})
        yield node


async def test_urls_asked_together_go_in_one_request_and_each_gets_its_own_line(fake):
    urls = [f"http://data.example/{n}" for n in range(10)]
    lines = await asyncio.gather(*(fake.batches.ask(u) for u in urls))
    assert [line["stored"] for line in lines] == [len(u) for u in urls]
    assert [b["urls"] for b in fake.bodies] == [urls]
    assert (fake.batches.requests, fake.batches.objects) == (1, 10)


async def test_urls_asked_while_a_batch_is_in_flight_go_at_once_without_waiting_for_it_to_end(fake):
    fake.slow = "http://data.example/a"
    first = asyncio.ensure_future(fake.batches.ask("http://data.example/a"))
    await asyncio.sleep(0.05)
    later = await asyncio.gather(*(fake.batches.ask(f"http://data.example/b{n}") for n in range(3)))
    assert [line["stored"] for line in later] == [len("http://data.example/b0")] * 3
    assert not first.done(), "answered while the first batch's object is still being filled"
    assert [b["urls"] for b in fake.bodies] == [["http://data.example/a"],
                                                [f"http://data.example/b{n}" for n in range(3)]]
    assert (await first)["stored"] == len("http://data.example/a")


async def test_a_node_without_the_endpoint_is_asked_the_ordinary_way_from_then_on(fake):
    fake.status = 404
    assert await fake.batches.ask("http://data.example/a") is None
    assert fake.batches.unsupported
    assert await fake.batches.ask("http://data.example/b") is None
    assert len(fake.bodies) == 1, "not asked again"


async def test_a_node_that_hangs_up_leaves_only_the_unanswered_urls_to_the_ordinary_way(fake):
    fake.hang_up = True
    lines = await asyncio.gather(fake.batches.ask("http://data.example/a"),
                                 fake.batches.ask("http://data.example/late"))
    assert lines[0] == {"url": "http://data.example/a", "stored": len("http://data.example/a")}
    assert lines[1] is None and not fake.batches.unsupported
