"""`nezha up` on a fresh machine: no redis-server installed, the embedded index still works."""

from __future__ import annotations

import asyncio
import os
import shutil

import aiohttp

from tests.integration.cluster.conftest import fetch, node_status, settle


async def flushed_stats(cluster, session, *, misses: int, timeout: float = 10.0) -> dict:
    """The cluster's stats once `misses` have reached the index and no node
    holds an update unsent: each node flushes every second, and a node
    starved of CPU for a while flushes late, so a fixed sleep is a race.
    Nothing unsent is asked first, then the stats: read the other way round,
    stats read before a flush landed passed once the flush had emptied the
    buffers (a miss counted, its bytes from the origin not yet)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        pending = [(await node_status(session, n.url))["index"]["buffered"] for n in cluster.nodes.values()]
        stats = await cluster.index.read_stats()
        if stats["cluster"]["misses"] >= misses and not any(pending):
            return stats
        assert asyncio.get_running_loop().time() < deadline, f"stats never flushed: {stats['cluster']}, pending {pending}"
        await asyncio.sleep(0.1)


async def test_cluster_without_redis_server_installed_runs_on_fakeredis(origin, start_cluster, monkeypatch, capsys):
    exe = shutil.which("redis-server")
    if exe is not None:  # hide it, the way a fresh machine lacks it
        path = [d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(d, "redis-server"))]
        monkeypatch.setenv("PATH", os.pathsep.join(path))
    assert shutil.which("redis-server") is None
    origin.put("/e/x", b"x" * 30_000)
    cluster = await start_cluster(2)
    assert cluster.redis_url.startswith("redis://127.0.0.1:")
    urls = [n.url for n in cluster.nodes.values()]
    async with aiohttp.ClientSession() as s:
        for u in urls:
            status, headers, body = await fetch(s, u, "/e/x")
            assert status == 200 and body == b"x" * 30_000
            await settle(cluster)
        stats = await flushed_stats(cluster, s, misses=1)
    assert stats["cluster"]["misses"] == 1 and stats["cluster"]["bytes_from_origin"] == 30_000
    assert origin.requests["/e/x"] == 1
    assert "fakeredis" in capsys.readouterr().out
