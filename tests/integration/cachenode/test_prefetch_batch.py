"""`POST /_nezha/prefetch`: a node fills the public objects the controller names, many in one request, and
answers a line per URL once each is stored (cachenode/front/prefetch_fills.py)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from nezha.config import Origin
from nezha.ring import Membership
from nezha.wire import PREFETCH_PATH, TOKEN_HEADER
from tests.integration.cachenode.conftest import HOST

TOKEN = "cluster-s3cret"


async def batch(session: aiohttp.ClientSession, node, urls: list[str], *, token: str | None = TOKEN,
                host: str = "node.internal", fills: int | None = None) -> tuple[int, dict[str, dict] | str]:
    headers = {"Host": host, **({TOKEN_HEADER: token} if token else {})}
    body = {"urls": urls, **({"fills": fills} if fills is not None else {})}
    async with session.post(node.url + PREFETCH_PATH, json=body, headers=headers) as r:
        if r.status != 200:
            return r.status, await r.text()
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(line) async for line in r.content if line.strip()]
    assert sorted(line["url"] for line in lines) == sorted(set(urls)), "one line per URL"
    return 200, {line["url"]: line for line in lines}


@pytest.fixture
async def node(origin, make_node):
    return await make_node(cluster_token=TOKEN)


async def test_a_batch_is_refused_without_the_cluster_token(origin, node, session):
    origin.put("/a.bin", b"a" * 1000, headers={"Cache-Control": "max-age=600"})
    for token in (None, "wrong"):
        status, text = await batch(session, node, [f"http://{HOST}/a.bin"], token=token)
        assert status == 403 and "cluster token" in text
    assert origin.requests["/a.bin"] == 0


async def test_every_url_is_stored_and_answered_with_its_size_and_read_back_as_a_hit(origin, node, session):
    bodies = {f"/d/{n}.bin": bytes([n]) * (1000 + n) for n in range(20)}
    for path, body in bodies.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=600"})
    status, lines = await batch(session, node, [f"http://{HOST}{p}" for p in bodies])
    assert status == 200
    assert {url: line.get("stored") for url, line in lines.items()} == {
        f"http://{HOST}{p}": len(b) for p, b in bodies.items()}
    for path, body in bodies.items():
        got = await node.get(session, path)
        assert (got[0], got[1]["X-Nezha-Cache"], got[2]) == (200, "hit", body)
        assert origin.requests[path] == 1


async def test_two_batches_naming_one_object_fill_it_once(origin, node, session):
    origin.put("/big.bin", b"b" * 300_000, headers={"Cache-Control": "max-age=600"}, delay=0.2)
    url = f"http://{HOST}/big.bin"
    answers = await asyncio.gather(batch(session, node, [url, url]), batch(session, node, [url]))
    assert [a[1][url]["stored"] for a in answers] == [300_000, 300_000]
    assert origin.requests["/big.bin"] == 1


async def test_a_host_outside_the_origin_table_is_refused_and_never_contacted(origin, node, session):
    origin.put("/a.bin", b"a" * 1000, headers={"Cache-Control": "max-age=600"})
    outside = f"{origin.url}/a.bin"  # the origin's own address: no entry of the table names it
    status, lines = await batch(session, node, [outside, f"http://{HOST}/a.bin"])
    assert status == 200
    assert lines[outside]["status"] == 403 and "not a configured origin" in lines[outside]["failed"]
    assert "open proxy" in lines[outside]["failed"]
    assert lines[f"http://{HOST}/a.bin"]["stored"] == 1000
    assert origin.requests["/a.bin"] == 1


async def test_each_url_that_fails_says_why_and_the_others_are_stored(origin, node, session):
    origin.put("/ok.bin", b"k" * 500, headers={"Cache-Control": "max-age=600"})
    origin.put("/moved", b"", status=302, headers={"Location": "/ok.bin"})
    origin.put("/private.bin", b"p" * 10, headers={"Cache-Control": "no-store"})
    origin.put("/broken.bin", b"x" * 100_000, headers={"Cache-Control": "max-age=600"}, die_after=1000)
    urls = {name: f"http://{HOST}/{name}" for name in ("ok.bin", "moved", "private.bin", "broken.bin", "none")}
    status, lines = await batch(session, node, list(urls.values()))
    assert status == 200
    assert lines[urls["ok.bin"]]["stored"] == 500
    assert (lines[urls["moved"]]["status"], lines[urls["moved"]]["location"]) == (302, "/ok.bin")
    assert (lines[urls["private.bin"]]["status"], lines[urls["private.bin"]]["passed"]) == (
        200, "the origin answered 200, which may not be stored")
    assert lines[urls["broken.bin"]]["status"] == 502 and "broken.bin" in lines[urls["broken.bin"]]["failed"]
    assert (lines[urls["none"]]["status"], lines[urls["none"]]["passed"]) == (
        404, "the origin answered 404, which may not be stored")


async def test_a_signed_origins_object_and_another_owners_key_are_handed_back(origin, make_node, session):
    node = await make_node(cluster_token=TOKEN, origins=[Origin(host=HOST, upstream=origin.url),
                                                         Origin(host="signed.example", upstream=origin.url,
                                                                credentials="authorize")])
    origin.put("/s.bin", b"s" * 10, headers={"Cache-Control": "max-age=600"})
    url = "http://signed.example/s.bin"
    status, lines = await batch(session, node, [url])
    assert "signed read" in lines[url]["not_here"]
    assert origin.requests["/s.bin"] == 0

    node.node.cluster.update(Membership(epoch=1, nodes={node.node.node_id: node.url[7:], "other": "127.0.0.1:9"}))
    theirs = next(f"/o/{n}.bin" for n in range(100)
                  if node.node.cluster.owners(f"http://{HOST}/o/{n}.bin")[0].id == "other")
    origin.put(theirs, b"o" * 10, headers={"Cache-Control": "max-age=600"})
    status, lines = await batch(session, node, [f"http://{HOST}{theirs}"])
    assert lines[f"http://{HOST}{theirs}"]["not_here"] == "other owns it first"
    assert origin.requests[theirs] == 0


async def test_a_batchs_fills_go_one_at_a_time_behind_a_live_request_and_together_once_it_ends(
        origin, make_node, session):
    node = await make_node(cluster_token=TOKEN, prefetch_busy_fills=1, prefetch_idle_fills=5, prefetch_quiet=0.05)
    origin.put("/slow.bin", b"s" * 100, headers={"Cache-Control": "max-age=600"}, delay=1.0)
    for n in range(5):
        origin.put(f"/p/{n}.bin", b"p" * 100, headers={"Cache-Control": "max-age=600"}, delay=0.1)
        origin.put(f"/q/{n}.bin", b"q" * 100, headers={"Cache-Control": "max-age=600"}, delay=0.1)
    live = asyncio.ensure_future(node.get(session, "/slow.bin"))
    while origin.requests["/slow.bin"] == 0:
        await asyncio.sleep(0.01)
    status, lines = await batch(session, node, [f"http://{HOST}/p/{n}.bin" for n in range(5)])
    assert not live.done(), "the live request was in flight throughout"
    assert [line["stored"] for line in lines.values()] == [100] * 5
    assert origin.most_in_flight == 2, "the live request and one prefetch fill at a time"
    assert node.node.pacing.started_while_live == 5
    assert (await live)[0] == 200

    await asyncio.sleep(0.1)  # quiet: no live request for longer than prefetch_quiet
    origin.most_in_flight = 0
    status, lines = await batch(session, node, [f"http://{HOST}/q/{n}.bin" for n in range(5)])
    assert [line["stored"] for line in lines.values()] == [100] * 5
    assert origin.most_in_flight == 5 and node.node.pacing.started_while_live == 5
    assert node.node.pacing.running == 0, "every slot given back once stored"


async def test_a_batch_runs_at_most_the_controllers_fills_at_once_and_the_rest_wait_here_for_a_slot(
        origin, node, session):
    """The controller names twice its `fills` ahead of time; the node holds the rest until a slot is free."""
    for n in range(6):
        origin.put(f"/c/{n}.bin", b"c" * 100, headers={"Cache-Control": "max-age=600"}, delay=0.1)
    seen: list[tuple[int, int]] = []

    async def sample() -> None:
        while True:
            seen.append((node.node.pacing.running, node.node.pacing.waiting))
            await asyncio.sleep(0.01)

    sampler = asyncio.ensure_future(sample())
    status, lines = await batch(session, node, [f"http://{HOST}/c/{n}.bin" for n in range(6)], fills=2)
    sampler.cancel()
    assert [line["stored"] for line in lines.values()] == [100] * 6
    assert origin.most_in_flight == 2, "no more than the controller's fills at once"
    assert max(waiting for _, waiting in seen) == 4 and max(running for running, _ in seen) == 2
    assert node.node.pacing.running == 0 and node.node.pacing.waiting == 0


@pytest.mark.parametrize("fills", [0, 2000, "4", True])
async def test_a_fills_bound_that_is_no_whole_number_in_range_is_refused(origin, node, session, fills):
    status, text = await batch(session, node, [f"http://{HOST}/a.bin"], fills=fills)
    assert status == 400 and '"fills"' in text
    assert origin.requests["/a.bin"] == 0


async def test_a_fill_that_breaks_here_is_a_500_line_and_the_other_urls_are_answered(origin, node, session,
                                                                                      monkeypatch):
    from nezha.errors import StoreError

    origin.put("/ok.bin", b"k" * 500, headers={"Cache-Control": "max-age=600"})
    origin.put("/bad.bin", b"b" * 500, headers={"Cache-Control": "max-age=600"})
    lead = node.node.engine.lead

    async def failing(flight, **kw):
        if kw["key"].endswith("/bad.bin"):
            raise StoreError("disk on fire")
        return await lead(flight, **kw)

    monkeypatch.setattr(node.node.engine, "lead", failing)
    status, lines = await batch(session, node, [f"http://{HOST}/bad.bin", f"http://{HOST}/ok.bin"])
    assert status == 200
    assert lines[f"http://{HOST}/ok.bin"]["stored"] == 500
    bad = lines[f"http://{HOST}/bad.bin"]
    assert bad["status"] == 500 and "StoreError: disk on fire" in bad["failed"]
    assert node.node.pacing.running == 0, "its slot was given back"
