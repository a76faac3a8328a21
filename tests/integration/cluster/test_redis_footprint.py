"""Redis holds little per object: three node processes on a real redis-server,
objects filled with two owners each, and the bytes Redis spends on them
(`MEMORY USAGE`, every key) divided by the copies held: at most 150 bytes
per object per copy (docs/redis-schema.md, "Object locations").

At 100,000 objects the index is written by three nodes' own index handles
(nezha/index/handle.py, what a node records a fill with), each object
under its two owners of a three-node ring, with ImageNet's path shapes:
filling 100,000 objects through node processes would take minutes of the
suite for the same records.
"""

from __future__ import annotations

import asyncio

import aiohttp
import redis.asyncio as aioredis

from nezha.index.handle import Index
from nezha.index.schema import holders, key_object
from nezha.keys import cache_key, parse_target
from nezha.ring import Ring

HOST = "www.cs.toronto.edu"
COUNT = 3000


MANY = 100_000


async def memory(r: aioredis.Redis) -> int:
    """`MEMORY USAGE` of every key, asked a thousand at a time."""
    total, keys = 0, [key async for key in r.scan_iter(count=1000)]
    for i in range(0, len(keys), 1000):
        pipe = r.pipeline(transaction=False)
        for key in keys[i:i + 1000]:
            pipe.memory_usage(key, samples=0)
        total += sum(n or 0 for n in await pipe.execute())
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


async def test_a_hundred_thousand_objects_on_three_nodes_cost_redis_at_most_150_bytes_per_object_per_copy(
        redis_server):
    nodes = [f"nezha-cache-{i}" for i in range(3)]
    ring = Ring({node: 1 for node in nodes})
    handles = {node: Index(redis_url=redis_server.url, node_id=node, max_buffered=5_000) for node in nodes}
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        before = await memory(r)
        keys = []
        for n in range(MANY):
            synset = f"n{1440764 + n % 1000:08d}"  # a thousand classes, as ImageNet-1k's train/
            path = f"/imagenet/train/{synset}/{synset}_{n:06d}.JPEG"
            key = cache_key(parse_target(path, HOST))
            keys.append(key)
            for owner in ring.owners(key, 2):
                handles[owner].object_stored(key, host=HOST, size=110_000)
            if n % 1000 == 999:
                assert all([await h.flush() for h in handles.values()]), "Redis refused a batch"
        assert all([await h.flush() for h in handles.values()])

        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.hkeys(key_object(key))
        held = [len(holders(fields)) for fields in await pipe.execute()]
        assert held == [2] * MANY, "every object recorded under its two owners"
        per_copy = (await memory(r) - before) / (2 * MANY)
        assert per_copy <= 150, f"{per_copy:.0f} bytes of Redis per object per copy at {MANY:,} objects"
    finally:
        await r.aclose()
        for h in handles.values():
            await h.close()
