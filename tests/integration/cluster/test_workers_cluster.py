"""Nodes with `--workers 2` in a real cluster (issue 26, item 1): replication,
the index and invalidation work as with one process per node.

Two node processes, each a primary and a follower on one port, R = 2, a real
redis-server, a local origin. Reads land on both workers of both nodes (each
on a connection of its own); a write through one node must leave no worker
of either node serving the old bytes.
"""

from __future__ import annotations

import asyncio

import aiohttp
import psutil
import pytest
import redis.asyncio as aioredis

from nezha.config import Origin
from nezha.dev.local_cluster import LocalCluster
from nezha.index.schema import holders, key_object
from testkit.ports import free_run
from testkit.waits import wait_for
from tests.integration.cluster.conftest import HOST, running, settle

PATH = "/datasets/shard-0000.tar"
OLD = bytes(range(256)) * 1024
NEW = b"replaced" * 4096


def listening_workers(pid: int, port: int) -> int:
    count = 0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in child.net_connections("tcp")):
                count += 1
        except psutil.Error:
            continue
    return count


@pytest.fixture
async def workers_cluster(origin, redis_server, tmp_path):
    cluster = LocalCluster(nodes=2, origins=[Origin(host=HOST, upstream=origin.url)], data_dir=tmp_path / "c",
                           base_port=free_run(2), replicas=2, redis_url=redis_server.url, log_level="info",
                           node_settings={"workers": 2})
    async with running(cluster):
        for node in cluster.nodes.values():
            port = int(node.address.rsplit(":", 1)[1])
            await wait_for(lambda: listening_workers(node.proc.pid, port) == 2, timeout=60)
        yield cluster


async def read_everywhere(cluster: LocalCluster, times: int = 12) -> list[tuple[bytes, str]]:
    """`times` GETs through each node, each on a connection of its own."""
    async def one(url: str) -> tuple[bytes, str]:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + PATH, headers={"Host": HOST}) as r:
                assert r.status == 200
                return await r.read(), r.headers["X-Nezha-Cache"]

    return await asyncio.gather(*(one(n.url) for n in cluster.nodes.values() for _ in range(times)))


async def test_replicas_and_a_write_reach_every_worker_of_every_node(origin, workers_cluster, redis_server):
    origin.put(PATH, OLD, headers={"Cache-Control": "max-age=3600"})
    answers = await read_everywhere(workers_cluster)
    assert all(body == OLD for body, _ in answers)
    assert origin.requests[PATH] == 1, "one origin fetch for both nodes and all their workers"
    await settle(workers_cluster)
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        await wait_for(lambda: _holders(r), timeout=15)
        assert holders(await r.hkeys(key_object(f"http://{HOST}{PATH}"))) == set(workers_cluster.nodes)
    finally:
        await r.aclose()
    warm = await read_everywhere(workers_cluster)
    assert all(body == OLD and label == "hit" for body, label in warm), "each node serves its replica"

    some = next(iter(workers_cluster.nodes.values()))
    async with aiohttp.ClientSession() as s:
        async with s.put(some.url + PATH, data=NEW, headers={"Host": HOST}) as w:
            assert w.status in (200, 201, 204)
    origin.put(PATH, NEW, headers={"Cache-Control": "max-age=3600"})
    after = await read_everywhere(workers_cluster)
    assert all(body == NEW for body, _ in after), sorted({label for body, label in after if body != NEW})


async def _holders(r) -> bool:
    return len(holders(await r.hkeys(key_object(f"http://{HOST}{PATH}")))) == 2
