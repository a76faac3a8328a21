"""kubectl scale 5 -> 2 as Kubernetes does it, on real node processes: nothing cached is lost.

The ring drops the leaving nodes (as the controller does when replicas
drop) and each gets SIGTERM at about the same moment, in either order,
then SIGKILL after its grace period. A node out of the ring hands its
objects to their owners before it exits; a node still in the ring (a
restart) exits at once and keeps its disk.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp

from tests.integration.cluster.conftest import fetch
from tests.integration.cluster.test_cluster_processes import cached_cluster

GRACE = 20.0  # the pod's terminationGracePeriodSeconds in this test


async def terminate_like_kubernetes(node, *, grace: float = GRACE) -> float:
    """SIGTERM, then SIGKILL if it has not exited after `grace`; seconds it took to exit."""
    started = time.monotonic()
    os.kill(node.proc.pid, signal.SIGTERM)
    while node.proc.poll() is None:
        if time.monotonic() - started > grace:
            node.proc.kill()
            node.proc.wait(5)
            break
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_scale_from_five_to_two_loses_nothing_cached(origin, start_cluster, redis_server):
    cluster, paths, _ = await cached_cluster(origin, start_cluster, redis_server, "scale", 40, nodes=5,
                                             leave_settle=2.0)  # as in Kubernetes
    fetched = sum(origin.requests.values())
    remaining = {k: v for k, v in cluster.members().items() if k in ("node-0", "node-1")}
    leaving = [cluster.nodes[f"node-{i}"] for i in (2, 3, 4)]
    # SIGTERM reaches node-4 a moment before the ring that drops it: it waits for that ring.
    exits = [asyncio.get_running_loop().create_task(terminate_like_kubernetes(leaving[-1]))]
    await cluster.publish(remaining, leaving={"node-2", "node-3", "node-4"})
    exits += [asyncio.get_running_loop().create_task(terminate_like_kubernetes(n)) for n in leaving[:-1]]
    took = await asyncio.gather(*exits)
    assert all(n.proc.returncode == 0 for n in leaving), [n.proc.returncode for n in leaving]
    assert max(took) < GRACE, "every leaving node finished its hand-off within the grace period"
    async with aiohttp.ClientSession() as s:
        for url in (cluster.nodes["node-0"].url, cluster.nodes["node-1"].url):
            for p in paths:
                status, _, body = await fetch(s, url, p)
                assert status == 200 and body == p.encode() * 1000
    assert sum(origin.requests.values()) == fetched, "not one origin fetch after the scale-down"


async def test_a_node_still_in_the_ring_exits_promptly_and_keeps_its_disk(origin, start_cluster, redis_server):
    cluster, paths, _ = await cached_cluster(origin, start_cluster, redis_server, "restart", 10, nodes=3,
                                             leave_settle=2.0)
    node = cluster.nodes["node-2"]
    held = [p for p in node.data_dir.rglob("*") if p.suffix in (".data", ".obj")]
    assert held
    took = await terminate_like_kubernetes(node)
    assert node.proc.returncode == 0 and took < 5.0
    assert [p for p in node.data_dir.rglob("*") if p.suffix in (".data", ".obj")] == held
    log = (cluster.data_dir / "node-2.log").read_text()
    assert "a restart keeps its disk" in log and "handing objects off" not in log
