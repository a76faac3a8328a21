from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import aiohttp
import pytest

from nezha.config import Origin
from nezha.dev.local_cluster import LocalCluster
from testkit.ports import free_run

HOST = "www.cs.toronto.edu"
# Seconds a node given SIGTERM has before `terminate` kills it: a hang guard, never what a test passes by.
# Past a node's longest way out (leave_settle, then a hand-off cut at shutdown_grace, 25 s by default),
# under the tests' own timeout (pyproject.toml), so a hung node shows as killed, not as a test timed out.
EXIT_GUARD = 60.0


@pytest.fixture
async def start_cluster(origin, tmp_path):
    """Real node processes on free ports, sharing an index."""
    started: list[LocalCluster] = []

    async def start(nodes: int = 3, *, replicas: int = 1, redis_url: str | None = None,
                    upstream: str | None = None, leave_settle: float = 0.0, node_settings: dict | None = None,
                    **origin_fields) -> LocalCluster:
        base = free_run(nodes)
        served = Origin(host=HOST, upstream=upstream or origin.url, **origin_fields)
        cluster = LocalCluster(nodes=nodes, origins=[served],
                               data_dir=tmp_path / f"cluster{len(started)}", base_port=base,
                               replicas=replicas, redis_url=redis_url, log_level="info",
                               leave_settle=leave_settle, node_settings=node_settings)
        started.append(cluster)
        await cluster.start()
        await wait_epoch(cluster, await cluster.index.get_membership())
        return cluster

    yield start
    for c in started:
        await c.stop()


@contextlib.asynccontextmanager
async def running(cluster: LocalCluster):
    """`cluster` started, every node at its ring's epoch; stopped however the test ends."""
    await cluster.start()
    try:
        await wait_epoch(cluster, await cluster.index.get_membership())
        yield cluster
    finally:
        await cluster.stop()


async def node_status(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/readyz") as r:
        return await r.json()


async def wait_epoch(cluster: LocalCluster, membership, timeout: float = 5.0) -> float:
    """Seconds until every live node reports the membership's epoch."""
    started = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - started < timeout:
            states = [await node_status(s, n.url) for n in cluster.nodes.values() if n.proc.poll() is None]
            if all(st.get("ring_epoch") == membership.epoch for st in states):
                return time.monotonic() - started
            await asyncio.sleep(0.01)
    raise AssertionError(f"nodes did not reach epoch {membership.epoch} within {timeout}s: {states}")


async def settle(cluster: LocalCluster, timeout: float = 10.0) -> None:
    """Wait until no live node has a fill in progress or background work
    running (replicas in a batch not yet sent among it)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            states = [await node_status(s, n.url) for n in cluster.nodes.values() if n.proc.poll() is None]
            if all(st["fills_in_flight"] == 0 and st["background_tasks"] == 0 for st in states):
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"fills still in flight after {timeout}s")


async def fetch(session: aiohttp.ClientSession, url: str, path: str, **headers) -> tuple[int, dict, bytes]:
    async with session.get(url + path, headers={"Host": HOST, **headers}) as r:
        return r.status, dict(r.headers), await r.read()


async def terminate(node) -> None:
    """SIGTERM, as the kubelet sends it, and wait until the node exits; SIGKILL only after EXIT_GUARD.

    Kubernetes kills a pod after its terminationGracePeriodSeconds. A node keeps within that by its own
    timers (a hand-off bounded by `shutdown_grace`, a restart's wait for the ring by `leave_settle`), and
    its log says which ended each wait (`node_leaving`, `handoff_finished` or `handoff_unfinished`): tests
    check that, not the seconds a loaded machine takes to get there. A kill here stops a node that hangs."""
    os.kill(node.proc.pid, signal.SIGTERM)
    guard = time.monotonic() + EXIT_GUARD
    while node.proc.poll() is None:
        if time.monotonic() > guard:
            node.proc.kill()
            node.proc.wait(5)
            return
        await asyncio.sleep(0.02)
