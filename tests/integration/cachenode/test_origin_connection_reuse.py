"""Many small misses at once reuse the node's keep-alive connections to the
origin: the origin sees about as many connections as there are fills in
flight, not one per object (docs/cache-node.md, "Small objects")."""

from __future__ import annotations

import asyncio

import aiohttp

COUNT = 400
CLIENTS = 16


async def test_small_misses_reuse_keep_alive_connections_to_the_origin(origin, make_node):
    for n in range(COUNT):
        origin.put(f"/img/{n}.jpg", bytes([n % 251]) * (3000 + n), headers={"Cache-Control": "max-age=600"})
    node = await make_node(small_gets=False)  # its own pool: test_small_gets_led.py counts its connections
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(COUNT):
        queue.put_nowait(n)

    async with aiohttp.ClientSession() as session:
        async def client() -> None:
            while not queue.empty():
                n = queue.get_nowait()
                status, headers, got = await node.get(session, f"/img/{n}.jpg")
                assert status == 200 and got == bytes([n % 251]) * (3000 + n)
                assert headers["X-Nezha-Cache"] == "miss"
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    assert sum(origin.requests.values()) == COUNT
    # At most one connection per fill in flight (and a few closed and reopened meanwhile).
    assert len(origin.connections) <= CLIENTS + 4, len(origin.connections)
