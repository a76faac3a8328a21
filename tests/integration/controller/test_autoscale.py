"""Autoscaling from the egress the nodes record in Redis, through the scale subresource only."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis

from tests.integration.controller.conftest import STS, annotate, dns, events_about, ring_becomes

FAST = {"nezha.io/autoscale": "true", "nezha.io/min-replicas": "1", "nezha.io/max-replicas": "4",
        "nezha.io/target-bytes-per-second": "1M", "nezha.io/scale-window": "1", "nezha.io/scale-cooldown": "1",
        "nezha.io/scale-down-delay": "2"}


async def replicas(cluster) -> int:
    return (await cluster.apps.read_namespaced_stateful_set_scale(STS, cluster.ns)).spec.replicas


async def replicas_become(cluster, want: int, timeout: float = 10.0) -> list[int]:
    """The replica counts seen on the way to `want` (every distinct value, in order)."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = await replicas(cluster)
        if not seen or seen[-1] != now:
            seen.append(now)
        if now == want:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"replicas went {seen}, never {want}")


async def serve_load(redis_url: str, nodes: list[str], bytes_per_second: float, stop: asyncio.Event) -> None:
    """Raise each node's bytes_served as a node serving that egress would (docs/redis-schema.md)."""
    r = aredis.from_url(redis_url)
    try:
        while not stop.is_set():
            for node in nodes:
                await r.hincrby(f"nezha:stats:node:{node}", "bytes_served", int(bytes_per_second / 10))
            await asyncio.sleep(0.1)
    finally:
        await r.aclose()


async def two_nodes_under_load(cluster, run_controller, index, ns: str, redis_url: str):
    """Two ready cache pods in the ring, the controller running, and 10 MB/s of egress on each;
    set the returned event to stop the load, then await the task."""
    await cluster.create(2)
    await cluster.add_pod(0)
    await cluster.add_pod(1)
    await run_controller()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)}, timeout=30.0)  # a wait, not a claim
    stop = asyncio.Event()
    load = asyncio.get_running_loop().create_task(serve_load(redis_url, ["nezha-cache-0", "nezha-cache-1"], 10e6, stop))
    return stop, load


async def test_heavy_egress_scales_up_then_idle_scales_down_one_step_at_a_time(cluster, run_controller, index, ns,
                                                                                 redis_server):
    stop, load = await two_nodes_under_load(cluster, run_controller, index, ns, redis_server.url)
    await annotate(cluster, FAST)
    assert (await replicas_become(cluster, 4))[-1] == 4  # 20 MB/s on 2 nodes for 1 MB/s each: at most doubling
    [up] = await events_about(cluster, reason="ScaledUp")
    assert "mean egress" in up.message and "2 -> 4" in up.message
    stop.set()
    await load
    seen = await replicas_become(cluster, 1, timeout=20.0)
    assert seen == [4, 3, 2, 1], "down one node at a time"
    downs = await events_about(cluster, reason="ScaledDown", count=3)
    assert len(downs) == 3 and all("half target" in e.message for e in downs)


async def test_a_users_scale_outside_the_bounds_is_clamped_with_an_event(cluster, run_controller, index, ns):
    await cluster.create(2)
    await cluster.add_pod(0)
    await run_controller()
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)}, timeout=30.0)  # a wait, not a claim of speed
    await annotate(cluster, {**FAST, "nezha.io/min-replicas": "2", "nezha.io/max-replicas": "3",
                             "nezha.io/target-bytes-per-second": "1G", "nezha.io/scale-down-delay": "300"})
    await cluster.apps.patch_namespaced_stateful_set_scale(STS, ns, {"spec": {"replicas": 5}})
    await replicas_become(cluster, 3)
    [clamped] = await events_about(cluster, reason="ScaleClamped")
    assert "5" in clamped.message and "nezha.io/max-replicas" in clamped.message
    await cluster.apps.patch_namespaced_stateful_set_scale(STS, ns, {"spec": {"replicas": 2}})
    await asyncio.sleep(1.5)
    assert await replicas(cluster) == 2, "a count inside the bounds is the user's, adopted as it is"


async def test_with_autoscaling_off_the_controller_never_writes_replicas(cluster, run_controller, index, ns,
                                                                         redis_server):
    stop, load = await two_nodes_under_load(cluster, run_controller, index, ns, redis_server.url)
    await annotate(cluster, {**FAST, "nezha.io/autoscale": "false"})
    await cluster.apps.patch_namespaced_stateful_set_scale(STS, ns, {"spec": {"replicas": 7}})
    await asyncio.sleep(2.0)
    stop.set()
    await load
    assert await replicas(cluster) == 7
    assert await events_about(cluster, reason="ScaledUp", timeout=0) == []
