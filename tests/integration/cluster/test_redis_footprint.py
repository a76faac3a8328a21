"""Redis holds little per object: three node processes on a real redis-server,
objects filled with two owners each, and the bytes Redis spends on them
(`MEMORY USAGE`, every key) divided by the copies held: at most 150 bytes
per object per copy (docs/redis-schema.md, "Object locations")."""

from __future__ import annotations

import asyncio

import aiohttp
import redis.asyncio as aioredis

from nezha.index.schema import holders, key_object

HOST = "www.cs.toronto.edu"
COUNT = 3000


async def memory(r: aioredis.Redis) -> int:
    total = 0
    async for key in r.scan_iter(count=1000):
        total += await r.memory_usage(key, samples=0) or 0
    return total


async def test_redis_spends_at_most_150_bytes_per_object_per_copy(origin, start_cluster, redis_server):
    for n in range(COUNT):
        origin.put(f"/imagenet/train/n{n:05d}/img_{n:07d}.JPEG", b"j" * 1000, headers={"Cache-Control": "max-age=3600"})
    cluster = await start_cluster(3, replicas=2, redis_url=redis_server.url)
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        before = await memory(r)
        entry = next(iter(cluster.nodes.values())).url
        sem = asyncio.Semaphore(32)
        async with aiohttp.ClientSession() as s:
            async def fill(n: int) -> None:
                async with sem:
                    async with s.get(f"{entry}/imagenet/train/n{n:05d}/img_{n:07d}.JPEG", headers={"Host": HOST}) as got:
                        assert got.status == 200 and len(await got.read()) == 1000
            await asyncio.gather(*(fill(n) for n in range(COUNT)))

        async def copies() -> int:
            pipe = r.pipeline(transaction=False)
            for n in range(COUNT):
                pipe.hkeys(key_object(f"http://{HOST}/imagenet/train/n{n:05d}/img_{n:07d}.JPEG"))
            return sum(len(holders(fields)) for fields in await pipe.execute())

        held = 0
        for _ in range(600):  # the owners' copies and index batches land in the background
            held = await copies()
            if held == COUNT * 2:
                break
            await asyncio.sleep(0.1)
        assert held == COUNT * 2
        per_copy = (await memory(r) - before) / held
        assert per_copy <= 150, f"{per_copy:.0f} bytes of Redis per object per copy"
    finally:
        await r.aclose()
