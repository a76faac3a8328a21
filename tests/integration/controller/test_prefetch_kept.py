"""What a workload prefetched is kept from eviction while it exists, and `nezha.io/prefetch-keep` after.

One node with a capacity of 1 MB (pins may hold half of it): a Job
prefetches three objects, a client then reads twice the capacity of other
objects, each read a few times in a row: the eviction policy
(docs/cache-node.md, "Eviction") gives room to what is read more often than
what it would evict, so those reads evict everything else. The prefetched objects stay while the Job exists; once it
is deleted and its keep has run out, the next such reads evict them like
any other object. The Job is made and deleted with the real kubectl.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import aiohttp
from kubernetes_asyncio import client

from nezha.config import Origin
from tests.integration.controller.conftest import STS, ring_becomes
from tests.integration.controller.test_prefetch import job_done, training_job

HOST = "data.example"
OBJECT = 100_000


async def stored(listener, path: str) -> bool:
    """Whether the node answers `path` from its disk (`only-if-cached`: 504 when it holds no copy)."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{listener.port}{path}",
                         headers={"Host": HOST, "Cache-Control": "only-if-cached"}) as r:
            await r.read()
            assert r.status in (200, 504), r.status
            return r.status == 200


async def scan(listener, prefix: str, count: int, times: int) -> None:
    """Read `count` objects, each `times` times in a row."""
    async with aiohttp.ClientSession() as s:
        for i in [i for i in range(count) for _ in range(times)]:
            async with s.get(f"http://127.0.0.1:{listener.port}{prefix}{i}.bin", headers={"Host": HOST}) as r:
                assert r.status == 200 and len(await r.read()) == OBJECT


async def nezha_stats(redis_url: str, *args: str) -> str:
    """`nezha stats` as an operator runs it (this checkout's command, on PATH)."""
    proc = await asyncio.create_subprocess_exec("nezha", "stats", "--redis-url", redis_url, *args,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def pinned_workloads(listener) -> dict[str, int]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{listener.port}/_nezha/pins") as r:
            return (await r.json())["workloads"]


async def test_prefetched_objects_survive_a_scan_of_twice_the_capacity_while_their_job_exists_and_go_after_keep(
        kube, ns, cluster, run_controller, index, origin, one_node, redis_server, kubectl):
    for prefix, count in (("/w/", 3), ("/scan/", 20), ("/again/", 20)):
        for i in range(count):
            origin.put(f"{prefix}{i}.bin", bytes([i]) * OBJECT, headers={"Cache-Control": "max-age=3600"})
    table = [Origin(host=HOST, upstream=origin.url)]
    listener = await one_node(table, capacity=1_000_000)
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    batch = client.BatchV1Api(kube)
    job = training_job("epochs", ",".join(f"http://{HOST}/w/{i}.bin" for i in range(3)))
    job["metadata"]["annotations"]["nezha.io/prefetch-keep"] = "1"
    await kubectl.create(job)
    status, _ = await job_done(batch, cluster.core, ns, "epochs")
    assert (status["done"], status["pinned"]) == (3, 3 * OBJECT)
    assert await pinned_workloads(listener) == {f"Job/{ns}/epochs": 3 * OBJECT}
    shown = json.loads(await nezha_stats(redis_server.url, "--json"))["pinned"]
    assert shown == {f"Job/{ns}/epochs": {"bytes": 3 * OBJECT, "until": None}}
    table = await nezha_stats(redis_server.url)
    assert f"Job/{ns}/epochs" in table and "while it exists" in table

    await scan(listener, "/scan/", 20, times=3)  # 2 MB, each object read 3 times, through a 1 MB node
    assert [await stored(listener, f"/w/{i}.bin") for i in range(3)] == [True] * 3
    assert not await stored(listener, "/scan/0.bin"), "the scan did not evict: the test proves nothing"
    assert [origin.requests[f"/w/{i}.bin"] for i in range(3)] == [1, 1, 1]

    await kubectl("delete", "job", "epochs")
    deadline = time.monotonic() + 10
    while await pinned_workloads(listener):  # released with a keep of 1 s, then expired
        assert time.monotonic() < deadline, "the deleted Job's pins did not end"
        await asyncio.sleep(0.1)
    await scan(listener, "/again/", 20, times=5)  # read more often than anything stored
    assert [await stored(listener, f"/w/{i}.bin") for i in range(3)] == [False] * 3
    assert json.loads(await nezha_stats(redis_server.url, "--json"))["pinned"] == {}


async def test_what_exceeds_the_pinned_share_is_refused_with_a_warning_saying_how_much_would_have_fit(
        kube, ns, cluster, run_controller, index, origin, one_node, kubectl):
    for i in range(3):
        origin.put(f"/w/{i}.bin", bytes([i]) * OBJECT, headers={"Cache-Control": "max-age=3600"})
    table = [Origin(host=HOST, upstream=origin.url)]
    listener = await one_node(table, capacity=500_000, pinned_share=0.4)  # pins may hold 200 KB
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    batch = client.BatchV1Api(kube)
    await kubectl.create(training_job("big", ",".join(f"http://{HOST}/w/{i}.bin" for i in range(3))))
    status, events = await job_done(batch, cluster.core, ns, "big")
    assert (status["done"], status["pinned"]) == (3, 2 * OBJECT)
    (warning,) = [e.message for e in events if e.reason == "PrefetchNotPinned"]
    assert "200000 bytes are kept" in warning and "100000 more are not" in warning
    assert "200000 bytes would have fit" in warning and "--pinned-share" in warning
