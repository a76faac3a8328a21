"""Live hits keep flowing while a prefetch runs: the node lets the controller's prefetch fills
(`X-Nezha-Prefetch`) through one at a time while it serves live requests (cachenode/front/pacing.py)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from aiohttp import web

from nezha.config import Origin
from nezha.wire import PREFETCH_CHECK, PREFETCH_FILL, PREFETCH_HEADER, PREFETCH_WAIT
from tests.integration.cachenode.conftest import until

HOST = "data.example"
FILLS = 5


class GatedOrigin:
    """Small objects at once, `/slow.bin` only once `release` is set: a live request held in flight."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.requests: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.Response:
        self.requests[request.path] += 1
        if request.path == "/slow.bin":
            await self.release.wait()
        return web.Response(body=request.path.encode() * 100, headers={"Cache-Control": "max-age=3600"})

    def prefetched(self) -> int:
        return sum(n for path, n in self.requests.items() if path.startswith("/p/"))


@pytest.fixture
async def gated(aiohttp_server):
    o = GatedOrigin()
    app = web.Application()
    app.router.add_get("/{tail:.*}", o.handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    o.url = f"http://127.0.0.1:{server.port}"
    yield o
    o.release.set()


async def test_live_hits_are_served_while_prefetch_fills_wait_their_turn_one_at_a_time(gated, make_node, session):
    node = await make_node(origins=[Origin(host=HOST, upstream=gated.url)], prefetch_busy_fills=1,
                           prefetch_idle_fills=FILLS, prefetch_quiet=0.05)
    pacing = node.node.pacing
    assert (await node.get(session, "/w.bin", host=HOST))[0] == 200
    await node.node.settled()
    live_miss = asyncio.ensure_future(node.get(session, "/slow.bin", host=HOST))
    await until(lambda: gated.requests["/slow.bin"] == 1)  # a live request in flight on the node

    fill = {PREFETCH_HEADER: PREFETCH_FILL, "Range": "bytes=0-0"}
    fills = {n: asyncio.ensure_future(node.get(session, f"/p/{n}.bin", host=HOST, headers=fill))
             for n in range(FILLS)}
    await until(lambda: pacing.waiting == FILLS - 1 and sum(f.done() for f in fills.values()) == 1)
    first = next(n for n, f in fills.items() if f.done())
    assert fills[first].result()[0] == 206
    assert gated.prefetched() == 1

    # The live traffic meanwhile: every hit served, none of the waiting fills let through.
    hits = [await node.get(session, "/w.bin", host=HOST) for _ in range(30)]
    assert [(status, h["X-Nezha-Cache"]) for status, h, _ in hits] == [(200, "hit")] * 30
    assert gated.prefetched() == 1 and pacing.waiting == FILLS - 1 and pacing.running == 1

    # The first fill is stored (the controller's check says so): the next one, and only it, starts.
    await node.node.settled()
    check = {PREFETCH_HEADER: PREFETCH_CHECK, "Cache-Control": "only-if-cached, max-stale"}
    assert (await node.get(session, f"/p/{first}.bin", host=HOST, method="HEAD", headers=check))[0] == 200
    await until(lambda: gated.prefetched() == 2)
    assert pacing.waiting == FILLS - 2 and pacing.running == 1

    # The live request ends; once the node is quiet the rest start together, up to the idle bound.
    gated.release.set()
    assert (await live_miss)[0] == 200
    answers = await asyncio.gather(*fills.values())
    assert [a[0] for a in answers] == [206] * FILLS
    assert gated.prefetched() == FILLS
    assert pacing.started == FILLS and pacing.started_while_live == 2


async def test_a_fill_that_waited_its_longest_is_told_to_ask_again_and_nothing_of_it_is_fetched(
        gated, make_node, session):
    node = await make_node(origins=[Origin(host=HOST, upstream=gated.url)], prefetch_busy_fills=1)
    pacing = node.node.pacing
    pacing.wait = 0.2
    live_miss = asyncio.ensure_future(node.get(session, "/slow.bin", host=HOST))
    await until(lambda: gated.requests["/slow.bin"] == 1)
    fill = {PREFETCH_HEADER: PREFETCH_FILL, "Range": "bytes=0-0"}
    assert (await node.get(session, "/p/0.bin", host=HOST, headers=fill))[0] == 206  # its slot held: no check

    status, headers, _ = await node.get(session, "/p/1.bin", host=HOST, headers=fill)
    assert (status, headers[PREFETCH_HEADER]) == (503, PREFETCH_WAIT)
    assert gated.requests["/p/1.bin"] == 0 and pacing.waiting == 0
    gated.release.set()
    assert (await live_miss)[0] == 200


async def test_a_check_of_a_fill_still_running_is_answered_once_it_is_stored_and_one_of_no_fill_at_once(
        aiohttp_server, make_node, session):
    """The controller's first "stored yet?" goes at once; the node holds it until the fill it runs commits."""
    rest = asyncio.Event()

    async def slow_body(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Cache-Control": "max-age=3600", "Content-Length": "2000"})
        await resp.prepare(request)
        await resp.write(b"a" * 1000)
        await rest.wait()
        await resp.write(b"b" * 1000)
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", slow_body)
    server = await aiohttp_server(app, host="127.0.0.1")
    node = await make_node(origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{server.port}")])
    check = {PREFETCH_HEADER: PREFETCH_CHECK, "Cache-Control": "only-if-cached, max-stale"}

    seen = looks(node.node.pacing)
    assert (await node.get(session, "/never.bin", host=HOST, method="HEAD", headers=check))[0] == 504
    assert seen == [(f"{HOST}/never.bin", False)], "one look found no fill running: answered, not held"

    fill = {PREFETCH_HEADER: PREFETCH_FILL, "Range": "bytes=0-0"}
    assert (await node.get(session, "/m.bin", host=HOST, headers=fill))[0] == 206
    asked = asyncio.ensure_future(node.get(session, "/m.bin", host=HOST, method="HEAD", headers=check))
    await asyncio.sleep(0.2)
    assert not asked.done(), "held while the fill runs"
    rest.set()
    status, headers, _ = await asked
    assert (status, headers["Content-Length"]) == (200, "2000")
    assert node.node.pacing.running == 0, "the check gave the fill's slot back"


async def test_the_controller_asks_which_of_many_fills_are_stored_in_one_request_and_their_slots_are_given_back(
        gated, make_node, session):
    """`/_nezha/stored` (cachenode/front/stored_checks.py): sizes of what is stored, the rest pending; a fill
    still running is waited for, up to a second."""
    node = await make_node(origins=[Origin(host=HOST, upstream=gated.url)], prefetch_idle_fills=FILLS)
    pacing = node.node.pacing
    fill = {PREFETCH_HEADER: PREFETCH_FILL, "Range": "bytes=0-0"}
    for n in range(3):
        assert (await node.get(session, f"/p/{n}.bin", host=HOST, headers=fill))[0] == 206
    keys = [key_of(f"/p/{n}.bin", gated.url) for n in range(3)]
    objects = [{"key": k, "object": f"{HOST}/p/{n}.bin"} for n, k in enumerate(keys)]
    objects.append({"key": key_of("/never.bin", gated.url), "object": f"{HOST}/never.bin"})
    seen = looks(pacing)
    async with session.post(node.url + "/_nezha/stored", json={"objects": objects}) as r:
        assert r.status == 200
        answer = await r.json()
    assert answer["stored"] == {k: len(f"/p/{n}.bin".encode() * 100) for n, k in enumerate(keys)}
    assert answer["pending"] == [objects[3]["key"]]
    # The answer waits only while a pending object's fill runs here: the unknown one's never did.
    assert [filling for obj, filling in seen if obj == f"{HOST}/never.bin"] == [False], seen
    assert pacing.running == 0, "each stored fill gave its slot back"


def looks(pacing) -> list[tuple[str, bool]]:
    """Each look a check or `/_nezha/stored` takes at whether an object's fill still runs here, and its
    answer: what decides whether the answer waits (front/pacing.py `_check`, front/stored_checks.py)."""
    seen: list[tuple[str, bool]] = []
    filling = pacing.filling

    def recorded(obj: str) -> bool:
        answer = filling(obj)
        seen.append((obj, answer))
        return answer

    pacing.filling = recorded
    return seen


def key_of(path: str, upstream: str) -> str:
    from nezha.keys import key_for, parse_target

    return key_for(parse_target(path, HOST), Origin(host=HOST, upstream=upstream))
