"""`nezha up` on a fresh machine: no redis-server installed, the embedded index still works."""

from __future__ import annotations

import asyncio
import os
import shutil

import aiohttp

from tests.integration.cluster.conftest import fetch, settle


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
        await asyncio.sleep(1.5)
    stats = await cluster.index.read_stats()
    assert stats["cluster"]["misses"] == 1 and stats["cluster"]["bytes_from_origin"] == 30_000
    assert origin.requests["/e/x"] == 1
    assert "fakeredis" in capsys.readouterr().out
