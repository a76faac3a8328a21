"""Small objects' replicas travel in batches between real node processes with a real redis-server.

A burst of small fills on three nodes with two owners per key is replicated
in far fewer requests than objects (counted at the receivers, as the
internal requests their /metrics report), every replica byte-exact on its
node's own disk; a record damaged in a batch is refused alone while the
others are stored; a peer that dies in the middle of a batch costs the
sender nothing it holds, and the records it did not answer are copied one
by one, whose failures are reported as ever (docs/cache-node.md, "Replicas").
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from cachenode.cluster.replica_frames import CONTENT_TYPE, HEAD_SIZE, encode, read_head
from nezha.index.schema import holders, key_object
from nezha.wire import PEER_HEADER, REPLICAS_PATH, TOKEN_HEADER

HOST = "www.cs.toronto.edu"
COUNT = 600
SIZE = 4096


def body_of(n: int) -> bytes:
    return (f"{n:06d}".encode() * (SIZE // 6 + 1))[:SIZE]


def path_of(n: int) -> str:
    return f"/imagenet/train/n{n % 50:05d}/img_{n:07d}.JPEG"


async def metric(session: aiohttp.ClientSession, url: str, name: str, labels: str = "") -> float:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def internal_requests(session: aiohttp.ClientSession, cluster) -> dict[str, float]:
    return {nid: await metric(session, n.url, "nezha_requests_total", '{cache="internal"}')
            for nid, n in cluster.nodes.items()}


async def wait_for_copies(r: aioredis.Redis, keys: list[str], copies: int, timeout: float = 60.0) -> list[set[str]]:
    deadline = time.monotonic() + timeout
    while True:
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.hkeys(key_object(key))
        held = [holders(fields) for fields in await pipe.execute()]
        if all(len(h) == copies for h in held) or time.monotonic() > deadline:
            return held
        await asyncio.sleep(0.1)


async def test_a_burst_of_small_fills_is_replicated_in_far_fewer_requests_than_objects(
        origin, start_cluster, redis_server):
    for n in range(COUNT):
        origin.put(path_of(n), body_of(n), headers={"Cache-Control": "max-age=3600"})
    cluster = await start_cluster(3, replicas=2, redis_url=redis_server.url)
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    keys = [f"http://{HOST}{path_of(n)}" for n in range(COUNT)]
    try:
        async with aiohttp.ClientSession() as s:
            before = await internal_requests(s, cluster)
            urls = [n.url for n in cluster.nodes.values()]
            gate = asyncio.Semaphore(32)

            async def fill(n: int) -> None:
                async with gate:
                    async with s.get(urls[n % 3] + path_of(n), headers={"Host": HOST}) as got:
                        assert got.status == 200 and await got.read() == body_of(n)

            await asyncio.gather(*(fill(n) for n in range(COUNT)))
            held = await wait_for_copies(r, keys, 2)
            assert [len(h) for h in held] == [2] * COUNT, "not every object reached its two owners"
            after = await internal_requests(s, cluster)
            requests = sum(after.values()) - sum(before.values())
            # One replica copy per object; one by one, that is one request at its receiver each
            # (and one more at the sender, for the bytes).
            assert requests <= COUNT / 5, f"{requests:.0f} internal requests for {COUNT} replicas"
            assert all(origin.requests[path_of(n)] == 1 for n in range(COUNT)), "an object was fetched twice"
            # Every copy exact, read from each holder's own disk.
            for n, nodes in enumerate(held):
                for nid in nodes:
                    async with s.get(cluster.nodes[nid].url + path_of(n), headers={"Host": HOST}) as got:
                        assert got.headers["X-Nezha-Cache"] == "hit", (nid, path_of(n), got.headers["X-Nezha-Cache"])
                        assert await got.read() == body_of(n), (nid, path_of(n))
        batches = [json.loads(line) for n in cluster.nodes.values() for line in cluster.log_of(n).read_text().splitlines()
                   if '"replicas_sent"' in line]
        assert sum(b["records"] for b in batches) == COUNT and all(b["again"] == 0 for b in batches)
    finally:
        await r.aclose()


def record(n: int, *, key: str, size: int) -> dict:
    now = time.time()
    return {"key": key, "url": key, "host": HOST, "size": size, "headers": [["Content-Type", "image/jpeg"]],
            "stored_at": now, "expires_at": now + 3600, "data": "x.obj"}


async def test_a_damaged_record_is_refused_while_the_others_of_its_batch_are_stored(
        origin, start_cluster, redis_server):
    cluster = await start_cluster(2, replicas=1, redis_url=redis_server.url)
    ring = (await cluster.index.get_membership()).ring()
    target = next(iter(cluster.nodes))
    paths = [p for p in (f"/batch/b{i}.jpg" for i in range(200)) if ring.owners(f"http://{HOST}{p}", 1) == [target]][:3]
    bodies = [bytes([65 + i]) * (1000 + i) for i in range(3)]
    frames = [bytearray(encode(record(0, key=f"http://{HOST}{p}", size=len(b)), b)) for p, b in zip(paths, bodies)]
    frames[1][-10] ^= 0x20  # a bit of the second record's body, flipped on the way
    node = cluster.nodes[target]
    async with aiohttp.ClientSession() as s:
        async with s.post(node.url + REPLICAS_PATH, data=b"".join(frames),
                          headers={TOKEN_HEADER: cluster.token, PEER_HEADER: "test", "Content-Type": CONTENT_TYPE,
                                   "Host": "127.0.0.1"}) as answer:
            assert answer.status == 200
            lines = [json.loads(line) for line in (await answer.text()).splitlines()]
        assert [(m["i"], m["result"].split(":")[0]) for m in lines[:3]] == [(0, "copied"), (1, "failed"), (2, "copied")]
        assert lines[3] == {"records": 3, "copied": 2}
        for i in (0, 2):
            async with s.get(node.url + paths[i], headers={"Host": HOST}) as got:
                assert got.headers["X-Nezha-Cache"] == "hit" and await got.read() == bodies[i]
        assert await metric(s, node.url, "nezha_corrupt_objects_total", '{found_by="copy"}') == 1
        # The damaged one was never stored: a read asks the origin, which has no such object.
        async with s.get(node.url + paths[1], headers={"Host": HOST}) as got:
            assert got.status == 404
    assert origin.requests[paths[0]] == 0 and origin.requests[paths[2]] == 0
    logged = [json.loads(line) for line in cluster.log_of(node).read_text().splitlines() if '"corrupt_copy"' in line]
    assert [m["key"] for m in logged] == [f"http://{HOST}{paths[1]}"]


class DyingPeer:
    """A peer in the ring that answers the first record of a batch and then drops the connection,
    and refuses every one-by-one copy."""

    def __init__(self) -> None:
        self.batches = 0
        self.one_by_one: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(REPLICAS_PATH, self.replicas)
        app.router.add_post("/_nezha/replicate", self.replicate)
        app.router.add_get("/healthz", self.healthz)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def replicas(self, request: web.Request) -> web.StreamResponse:
        self.batches += 1
        head = read_head(await request.content.readexactly(HEAD_SIZE))
        await request.content.readexactly(head.payload)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        await resp.write(b'{"i": 0, "result": "copied"}\n')
        await asyncio.sleep(0.05)
        request.transport.abort()  # dies mid-batch
        return resp

    async def replicate(self, request: web.Request) -> web.Response:
        self.one_by_one.append((await request.json())["path"])
        return web.Response(status=503, text="dying\n")


async def test_a_peer_dying_mid_batch_costs_the_sender_nothing_and_its_records_are_copied_one_by_one(
        origin, start_cluster, redis_server, aiohttp_server):
    dying = DyingPeer()
    server = await aiohttp_server(dying.app(), host="127.0.0.1")
    cluster = await start_cluster(2, replicas=2, redis_url=redis_server.url)
    members = {**cluster.members(), "dying": f"127.0.0.1:{server.port}"}
    await cluster.publish(members)
    ring = (await cluster.index.get_membership()).ring()  # the ring the nodes now hold
    sender = next(iter(cluster.nodes))
    paths = [p for p in (f"/dying/d{i}.jpg" for i in range(2000))
             if ring.owners(f"http://{HOST}{p}", 2) == [sender, "dying"]][:40]
    assert len(paths) == 40
    for i, p in enumerate(paths):
        origin.put(p, body_of(i), headers={"Cache-Control": "max-age=3600"})
    node = cluster.nodes[sender]
    async with aiohttp.ClientSession() as s:
        async def fill(i: int, p: str) -> None:
            async with s.get(node.url + p, headers={"Host": HOST}) as got:
                assert got.status == 200 and await got.read() == body_of(i)

        await asyncio.gather(*(fill(i, p) for i, p in enumerate(paths)))
        deadline = time.monotonic() + 30
        while len(dying.one_by_one) < len(paths) - dying.batches and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        # The sender still holds every object, exact, and says so in the index.
        for i, p in enumerate(paths):
            async with s.get(node.url + p, headers={"Host": HOST}) as got:
                assert got.headers["X-Nezha-Cache"] == "hit" and await got.read() == body_of(i)
    assert all(origin.requests[p] == 1 for p in paths)
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        held = await wait_for_copies(r, [f"http://{HOST}{p}" for p in paths], 1)
        assert all(h == {sender} for h in held)
    finally:
        await r.aclose()
    # Each batch's first record was answered as copied; every other went one by one, and failed there, reported.
    assert dying.batches >= 1
    assert sorted(dying.one_by_one) == sorted(set(dying.one_by_one))
    assert len(dying.one_by_one) == len(paths) - dying.batches
    lines = [json.loads(line) for line in cluster.log_of(node).read_text().splitlines()]
    sent = [m for m in lines if m.get("event") == "replicas_sent"]
    assert sum(m["again"] for m in sent) == len(paths) - dying.batches and all("error" in m for m in sent)
    failed = [m for m in lines if m.get("event") == "replicate_failed" and m.get("peer") == "dying"]
    assert len(failed) == len(paths) - dying.batches
