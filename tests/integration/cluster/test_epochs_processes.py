"""A dataset larger than the cache, read epoch after epoch through real node
processes and a real redis-server (issue 36; docs/cache-node.md "Eviction").

Small objects and small capacities keep each run to seconds; what is
measured is how many reads the origin served (`origin.requests`), from the
second epoch on.
"""

from __future__ import annotations

import random
import signal

import aiohttp
import pytest

from nezha.config import Origin
from nezha.dev.local_cluster import LocalCluster
from testkit.ports import free_run
from tests.integration.cluster.conftest import HOST, fetch, running, settle

SIZE = 4096


def body(path: str) -> bytes:
    return (path.encode() * (SIZE // len(path) + 1))[:SIZE]


def dataset(origin, name: str, count: int) -> list[str]:
    paths = [f"/{name}/{i:05d}.jpg" for i in range(count)]
    for p in paths:
        origin.put(p, body(p))
    return paths


def cluster_of(origin, redis_server, tmp_path, *, nodes: int, capacity: int, replicas: int) -> LocalCluster:
    return LocalCluster(nodes=nodes, origins=[Origin(host=HOST, upstream=origin.url)], data_dir=tmp_path / "c",
                        base_port=free_run(nodes), replicas=replicas, redis_url=redis_server.url, log_level="info",
                        node_settings={"capacity": capacity, "hot_reads": 0})


async def epoch(session: aiohttp.ClientSession, cluster: LocalCluster, paths: list[str], rng: random.Random,
                origin) -> float:
    """One shuffled epoch, reads spread over the nodes as a Service spreads them; the share the origin did not serve."""
    urls = [n.url for n in cluster.nodes.values() if n.proc.poll() is None]
    order = list(paths)
    rng.shuffle(order)
    before = sum(origin.requests.values())
    for i, p in enumerate(order):
        status, _, got = await fetch(session, urls[i % len(urls)], p)
        assert status == 200 and got == body(p), p
    await settle(cluster)
    return 1 - (sum(origin.requests.values()) - before) / len(order)


async def test_one_node_at_half_the_dataset_serves_half_of_shuffled_epochs_from_the_second(origin, redis_server,
                                                                                           tmp_path):
    paths = dataset(origin, "train", 200)
    rng = random.Random(7)
    async with running(cluster_of(origin, redis_server, tmp_path, nodes=1, capacity=100 * SIZE, replicas=1)) as c:
        async with aiohttp.ClientSession() as s:
            ratios = [await epoch(s, c, paths, rng, origin) for _ in range(5)]
    print("one node, half the dataset:", ratios)
    assert sum(ratios[1:]) / 4 >= 0.45, ratios


async def test_three_nodes_with_two_owners_hold_a_dataset_of_their_summed_capacity(origin, redis_server, tmp_path):
    """Extra copies are given up before only copies: the tier's capacity goes to distinct objects."""
    paths = dataset(origin, "train", 180)
    rng = random.Random(11)
    async with running(cluster_of(origin, redis_server, tmp_path, nodes=3, capacity=60 * SIZE, replicas=2)) as c:
        async with aiohttp.ClientSession() as s:
            ratios = [await epoch(s, c, paths, rng, origin) for _ in range(5)]
    print("three nodes, two owners:", ratios)
    assert sum(ratios[1:]) / 4 >= 0.85, ratios


async def test_a_new_dataset_that_fits_is_served_from_disk_from_its_third_epoch(origin, redis_server, tmp_path):
    old, new = dataset(origin, "v1", 200), dataset(origin, "v2", 50)
    rng = random.Random(3)
    async with running(cluster_of(origin, redis_server, tmp_path, nodes=1, capacity=100 * SIZE, replicas=1)) as c:
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                await epoch(s, c, old, rng, origin)
            ratios = [await epoch(s, c, new, rng, origin) for _ in range(4)]
    assert min(ratios[2:]) >= 0.9, ratios


async def test_a_node_killed_while_the_tier_is_half_full_costs_no_origin_fetch(origin, redis_server, tmp_path):
    paths = dataset(origin, "half", 60)
    rng = random.Random(5)
    async with running(cluster_of(origin, redis_server, tmp_path, nodes=3, capacity=60 * SIZE, replicas=2)) as c:
        async with aiohttp.ClientSession() as s:
            await epoch(s, c, paths, rng, origin)
            fetched = sum(origin.requests.values())
            assert fetched == len(paths)
            c.nodes["node-1"].proc.send_signal(signal.SIGKILL)
            c.nodes["node-1"].proc.wait()
            assert await epoch(s, c, paths, rng, origin) == 1.0
    assert sum(origin.requests.values()) == fetched
