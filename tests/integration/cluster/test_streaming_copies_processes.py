"""Streaming copies with real node processes and a real redis-server (cachenode/cluster/streaming_copies.py):
the readers of a cold object on each node share one stream from the key's owner, kept as that node's copy
while it arrives; when the owner is killed mid-fill the copies go on from the next owner, else the origin,
and no reader sees the break.

Three nodes, two owners per key: one client reads through the first owner (the filler), three through the
second owner and three through the non-owner, all at once, before the origin's first byte (it waits half a
second before its headers), so every node's readers are there when their first read's answer comes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from datetime import datetime

import aiohttp
from aiohttp import web

from tests.integration.cachenode.conftest import RangedOrigin, until
from tests.integration.cluster.conftest import HOST
from testkit.logs import log_events

MiB = 1 << 20
SIZE = 12 * MiB
KILL_AT = 4 * MiB


class SlowFirstByte(RangedOrigin):
    """The RangedOrigin, with half a second before the headers of a plain GET (a cold origin's think time)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if "Range" not in request.headers:
            await asyncio.sleep(0.5)
        return await super().handle(request)


def events(cluster, node, name: str) -> list[dict]:
    return log_events(cluster.log_of(node), name)


def at(entry: dict) -> float:
    return datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()


async def scene(start_cluster, redis_server, aiohttp_server, *, kill_at: int | None):
    body = os.urandom(SIZE)
    upstream = SlowFirstByte(body, {"ETag": '"v1"', "Cache-Control": "max-age=3600"}, rate=6 * MiB)
    server = await aiohttp_server(upstream.app(), host="127.0.0.1")
    cluster = await start_cluster(3, replicas=2, redis_url=redis_server.url,
                                  upstream=f"http://127.0.0.1:{server.port}")
    ring = (await cluster.index.get_membership()).ring()
    path = next(p for p in (f"/big/{i}.bin" for i in range(200))
                if ring.owners(f"http://{HOST}{p}", 2) == ["node-0", "node-1"])
    first, second, other = (cluster.nodes[n] for n in ("node-0", "node-1", "node-2"))
    through = [first] + [second] * 3 + [other] * 3
    got = [hashlib.sha256() for _ in through]
    labels: list[str | None] = [None] * len(through)

    async def read(i: int, s: aiohttp.ClientSession) -> int:
        n = 0
        async with s.get(through[i].url + path, headers={"Host": HOST}) as r:
            assert r.status == 200, await r.text()
            labels[i] = r.headers.get("X-Nezha-Cache")
            async for chunk in r.content.iter_chunked(64 * 1024):
                got[i].update(chunk)
                n += len(chunk)
                if i == 0 and kill_at is not None and n >= kill_at and first.proc.poll() is None:
                    first.proc.send_signal(signal.SIGKILL)
                    return n  # this client's node is gone: its read ends with it
        return n

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        results = await asyncio.gather(*(read(i, s) for i in range(len(through))), return_exceptions=True)
    return cluster, upstream, body, got, labels, results


async def test_each_nodes_readers_share_one_stream_that_begins_while_the_owner_fills(
        start_cluster, redis_server, aiohttp_server):
    cluster, upstream, body, got, labels, results = await scene(start_cluster, redis_server, aiohttp_server,
                                                                kill_at=None)
    want = hashlib.sha256(body).hexdigest()
    assert [h.hexdigest() for h in got] == [want] * 7, results
    assert labels == ["miss"] + ["hot-miss"] * 6
    first, second, other = (cluster.nodes[n] for n in ("node-0", "node-1", "node-2"))

    def from_origin() -> list[dict]:
        return [e for e in events(cluster, first, "fill_completed") if e.get("source") == "origin"]

    await until(lambda: from_origin(), timeout=10)  # its last reader can have its last byte before the commit
    filled = from_origin()
    assert len(filled) == 1
    for node, source, hot in ((second, "node-0", False), (other, "node-1", True)):  # a chain of copies
        # `waiting`: the node's two other readers. The third node's copy request to the second owner is
        # logged apart (`peers`): it comes before or after that owner's answer as the load orders them.
        started = events(cluster, node, "streaming_copy_started")
        assert [(e["source"], e["hot"], e["waiting"]) for e in started] == [(source, hot, 2)], started
        assert at(started[0]) < at(filled[0]), "the copy began before the owner's fill ended"
    assert [h.get("Range") for h in upstream.seen] == [None], "one origin request, from the first owner"


async def test_an_owner_killed_mid_fill_leaves_the_copies_going_on_from_the_next_owner_and_the_origin(
        start_cluster, redis_server, aiohttp_server):
    """The first owner is SIGKILLed a third of the way in. The second owner's copy goes on from the origin
    (one range, from the byte it had reached), spliced up to the break and joined on in Python after it;
    the non-owner's copy streams from the second owner's throughout (a chain of copies); every one of
    their six readers gets exact bytes, and none of them sees the break."""
    cluster, upstream, body, got, labels, results = await scene(start_cluster, redis_server, aiohttp_server,
                                                                kill_at=KILL_AT)
    first, second, other = (cluster.nodes[n] for n in ("node-0", "node-1", "node-2"))
    assert first.proc.wait(5) == -signal.SIGKILL
    want = hashlib.sha256(body).hexdigest()
    assert [h.hexdigest() for h in got[1:]] == [want] * 6, results
    assert labels[1:] == ["hot-miss"] * 6
    resumed = [(e["source"], e["offset"] > 0) for n in (second, other)
               for e in events(cluster, n, "streaming_copy_resumed")]
    assert resumed == [("node-0", True)], resumed
    ranges = [h.get("Range") for h in upstream.seen]
    assert ranges[0] is None and len(ranges) == 2, f"the first fill, then one rest of the second owner's copy: {ranges}"
    first_byte, last_byte = (int(x) for x in ranges[1].removeprefix("bytes=").split("-"))
    assert 0 < first_byte and last_byte == SIZE - 1
    assert upstream.seen[1].get("If-Range") == '"v1"'
