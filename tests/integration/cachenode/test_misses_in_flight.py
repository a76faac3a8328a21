"""Many small misses at once are all in flight to the origin at once (a first epoch limited by the origin, not the node): with 64 clients
asking 64 distinct cold objects, the origin is answering all 64 together, not one after another, and a
second wave goes out on the same keep-alive connections. Counted at the origin, never timed: the origin
holds every answer until it has as many requests in flight as the test asks, so the count is exact on a
loaded machine and a node that sent them one at a time would leave it waiting (and the test failing)."""

from __future__ import annotations

import asyncio
import os

import aiohttp

CLIENTS = 64


async def test_64_cold_misses_are_all_at_the_origin_at_once_and_a_second_wave_reuses_their_connections(
        origin, make_node):
    bodies = {f"/d/{n}.bin": os.urandom(16 * 1024) for n in range(2 * CLIENTS)}
    for path, body in bodies.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=3600"})
    full = origin.hold_until_in_flight(CLIENTS)
    # The engine's pool alone: --small-gets asks the second wave on connections of its own
    # (test_small_gets_led.py holds the same of those).
    node = await make_node(small_gets=False)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def wave(paths: list[str]) -> None:
            got = await asyncio.gather(*(node.get(session, p) for p in paths))
            for p, (status, headers, body) in zip(paths, got):
                assert status == 200 and body == bodies[p] and headers["X-Nezha-Cache"] == "miss"

        paths = list(bodies)
        await wave(paths[:CLIENTS])
        assert origin.most_in_flight == CLIENTS, f"at most {origin.most_in_flight} of {CLIENTS} misses at the origin"
        first = set(origin.connections)
        full.clear()
        origin.most_in_flight = 0
        await wave(paths[CLIENTS:])
        assert origin.most_in_flight == CLIENTS
    assert len(first) == CLIENTS, "one connection per miss in flight"
    assert origin.connections == first, f"{len(origin.connections - first)} new connections for the second wave"
    assert all(origin.requests[p] == 1 for p in bodies)
