"""Whole-object relays between real node processes (a real redis-server) when the owner's answer is cut
mid-body: an owner whose own origin fill broke off is alive and stays in the ring order, an owner that was
killed is marked down (cachenode/peers/cuts.py, cachenode/front/relay.py).

Three nodes, two owners per key (node-0, then node-1); the client reads through node-2, so its read is
relayed from node-0 while node-0 fills the object from the origin.
"""

from __future__ import annotations

import hashlib
import os
import signal

import aiohttp

from tests.integration.cachenode.conftest import until
from tests.integration.cluster.conftest import HOST, fetch
from testkit.logs import log_events

MiB = 1 << 20
SIZE = 4 * MiB


async def three_nodes(start_cluster, redis_server):
    """The cluster, and a path whose owners are node-0 then node-1."""
    cluster = await start_cluster(3, replicas=2, redis_url=redis_server.url)
    ring = (await cluster.index.get_membership()).ring()
    path = next(p for p in (f"/cut/{i}.bin" for i in range(200))
                if ring.owners(f"http://{HOST}{p}", 2) == ["node-0", "node-1"])
    return cluster, path


async def exact_or_cut(url: str, path: str, body: bytes, *, kill=None) -> str:
    """GET `path` through `url`: "exact" (every byte, right) or "cut" (a 200 whose connection ended early,
    every byte before it right); never a short body that ends cleanly. `kill(n)`: called with the bytes
    received so far after each piece."""
    digest, n = hashlib.sha256(), 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.get(url + path, headers={"Host": HOST}) as r:
            assert r.status == 200, await r.text()
            try:
                async for data in r.content.iter_chunked(64 * 1024):
                    digest.update(data)
                    n += len(data)
                    if kill is not None:
                        kill(n)
            except aiohttp.ClientPayloadError:
                assert n < len(body)
    assert digest.hexdigest() == hashlib.sha256(body[:n]).hexdigest(), f"a wrong byte within the first {n}"
    return "exact" if n == len(body) else "cut"


async def test_an_owner_whose_origin_dies_mid_body_of_a_relayed_read_is_not_marked_down(
        origin, start_cluster, redis_server):
    """The origin drops node-0's fill a quarter of the way in, so node-0 cuts the answer it relays to node-2.
    node-2 asks why, is told node-0's fill failed, and does not mark node-0 down; its client gets exact
    bytes (resumed from node-1, else the origin) or a cut. The next read through node-2 goes to node-0 again."""
    body = os.urandom(SIZE)
    cluster, path = await three_nodes(start_cluster, redis_server)
    origin.put(path, body, die_after=SIZE // 4, rate=16 * MiB, headers={"Cache-Control": "max-age=3600"})
    entry = cluster.nodes["node-2"]
    assert await exact_or_cut(entry.url, path, body) in ("exact", "cut")
    log = cluster.log_of(entry)
    await until(lambda: log_events(log, "peer_fill_failed") or log_events(log, "peer_marked_down"), timeout=10)
    downs = [(e["peer"], e["reason"]) for e in log_events(log, "peer_marked_down")]
    assert downs == [], f"node-2 marked a live owner down for its origin's failure: {downs}"
    told = [(e["peer"], e["path"]) for e in log_events(log, "peer_fill_failed")]
    assert ("node-0", path) in told, told
    origin.behaviour[path].die_after = None
    async with aiohttp.ClientSession() as s:
        status, headers, got = await fetch(s, entry.url, path)
    assert status == 200 and got == body
    assert headers["X-Nezha-Served-By"] == "node-0", "the next read went around the first owner"


async def test_an_owner_killed_mid_body_of_a_relayed_read_is_marked_down_and_the_client_gets_exact_bytes(
        origin, start_cluster, redis_server):
    """node-0 is SIGKILLed while it relays its fill to node-2: node-2's question of why finds nobody, so
    node-0 is marked down, and the client's body is resumed from node-1 (else the origin) without a break."""
    body = os.urandom(SIZE)
    cluster, path = await three_nodes(start_cluster, redis_server)
    origin.put(path, body, rate=8 * MiB, headers={"Cache-Control": "max-age=3600"})
    owner, entry = cluster.nodes["node-0"], cluster.nodes["node-2"]

    def kill(n: int) -> None:
        if n >= SIZE // 4 and owner.proc.poll() is None:
            owner.proc.send_signal(signal.SIGKILL)

    assert await exact_or_cut(entry.url, path, body, kill=kill) == "exact"
    assert owner.proc.wait(5) == -signal.SIGKILL
    log = cluster.log_of(entry)
    downs = [e for e in log_events(log, "peer_marked_down") if e["peer"] == "node-0"]
    assert downs and "did not answer" in downs[0]["reason"], downs
    assert not log_events(log, "peer_fill_failed")
