"""A job's checkpoint upload through a real node process: streamed, never held."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import psutil

from tests.integration.cluster.conftest import HOST

GIB = 1 << 30
CHUNK = 1 << 20


async def test_a_one_gib_put_streams_through_a_node_byte_for_byte_with_bounded_memory(origin, start_cluster):
    cluster = await start_cluster(nodes=1)
    node = next(iter(cluster.nodes.values()))
    proc = psutil.Process(node.proc.pid)
    before = proc.memory_info().rss
    peak = before
    sent = hashlib.sha256()
    block = bytes(range(256)) * (CHUNK // 256)

    async def body():
        for i in range(GIB // CHUNK):
            piece = block[i % 256:] + block[:i % 256]  # no two neighbouring chunks alike
            sent.update(piece)
            yield piece

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, proc.memory_info().rss)
            await asyncio.sleep(0.05)

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        async with aiohttp.ClientSession() as s:
            async with s.put(f"{node.url}/ckpt/model.pt", data=body(),
                             headers={"Host": HOST, "Content-Length": str(GIB)},
                             timeout=aiohttp.ClientTimeout(total=300)) as r:
                assert r.status == 200, await r.text()
    finally:
        watcher.cancel()
    assert origin.uploads["/ckpt/model.pt"] == (GIB, sent.hexdigest())
    grew = (peak - before) / 2**20
    assert grew < 64, f"the node's RSS grew by {grew:.0f} MiB while 1024 MiB passed through it"
