"""A cancelled controller stops, also when a Redis call swallowed the cancellation (nezha/cancels.py)."""

from __future__ import annotations

import asyncio

from tests.integration.controller.conftest import dns, ring_becomes


async def test_a_controller_stops_when_a_redis_call_swallows_its_cancellation(cluster, run_controller, index, ns):
    await cluster.create(1)
    await cluster.add_pod(0)
    controller = await run_controller()
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)}, timeout=30.0)  # a wait, not a claim of speed
    entered = asyncio.Event()
    swallowed = []

    async def read_cluster_stats():
        """As redis-py's write under wait_for on Python 3.11: the cancellation lands as the call completes
        and the call returns its result instead of raising."""
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.append(True)
        return {}

    controller.index.read_cluster_stats = read_cluster_stats  # the pass's one Redis read after its write
    await cluster.set_ready(0, False)
    await cluster.add_pod(1)
    await asyncio.wait_for(entered.wait(), 30.0)
    controller.test_task.cancel()
    done, _ = await asyncio.wait([controller.test_task], timeout=10.0)
    assert swallowed == [True]
    assert done, "the controller went on after its cancellation was swallowed"
