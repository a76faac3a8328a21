"""nezha.io/prefetch on a Job: each URL filled once by its owner, progress on the Job, later GETs are hits."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from kubernetes_asyncio import client

from cachenode.app import build_node
from cachenode.front.listener import Listener
from nezha.config import CacheSettings, Origin
from tests.integration.controller.conftest import STS, pod, ring_becomes

HOST = "www.cs.toronto.edu"


def training_job(name: str, prefetch: str) -> dict:
    spec = {"restartPolicy": "Never", "containers": [{"name": "train", "image": "trainer:1",
                                                      "command": ["python", "train.py"]}]}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "annotations": {"nezha.io/prefetch": prefetch}},
            "spec": {"template": {"spec": spec}}}


async def job_done(batch: client.BatchV1Api, core: client.CoreV1Api, ns: str, name: str,
                   timeout: float = 10.0) -> tuple[dict, list]:
    """The Job's prefetch-status once its PrefetchDone Event exists, and the Events about it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = [e for e in (await core.list_namespaced_event(ns)).items if e.involved_object.name == name]
        if any(e.reason == "PrefetchDone" for e in events):
            job = await batch.read_namespaced_job(name, ns)
            return json.loads(job.metadata.annotations["nezha.io/prefetch-status"]), events
        await asyncio.sleep(0.05)
    raise AssertionError(f"no PrefetchDone for {ns}/{name} within {timeout} s")


async def test_prefetch_fills_each_url_once_reports_on_the_job_and_a_later_get_is_a_hit(
        kube, ns, cluster, run_controller, index, origin, redis_server, tmp_path):
    origin.put("/d/a.bin", b"a" * 300_000, headers={"Cache-Control": "max-age=3600"}, rate=3_000_000)
    origin.put("/d/b.bin", b"b" * 100_000, headers={"Cache-Control": "max-age=3600"})
    node = build_node(CacheSettings(listen="127.0.0.1:0", data_dir=tmp_path / "n0", node_id=f"{STS}-0",
                                    redis_url=redis_server.url,
                                    origins=[Origin(host=HOST, upstream=origin.url)]))
    listener = Listener(node)
    await listener.start("127.0.0.1", 0)
    try:
        await cluster.create(1)
        cache_pod = pod(0)
        cache_pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": listener.port}]
        await cluster.core.create_namespaced_pod(ns, cache_pod)
        await cluster.set_ready(0, True, ip="127.0.0.1")
        await run_controller(peer_address="pod-ip")
        await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"})

        batch = client.BatchV1Api(kube)
        urls = f"http://{HOST}/d/a.bin, http://{HOST}/d/b.bin,http://evil.example/x"
        await batch.create_namespaced_job(ns, training_job("train-1", urls))
        await batch.create_namespaced_job(ns, training_job("train-2", f"http://{HOST}/d/a.bin"))
        status, events = await job_done(batch, cluster.core, ns, "train-1")
        assert status["total"] == 3 and status["done"] == 2 and status["bytes"] == 400_000
        assert [f["url"] for f in status["failed"]] == ["http://evil.example/x"]
        assert any(e.type == "Warning" and "http://evil.example/x" in e.message for e in events)
        second, _ = await job_done(batch, cluster.core, ns, "train-2")
        assert second == {"total": 1, "done": 1, "failed": [], "bytes": 300_000, "pinned": 300_000}
        assert origin.requests["/d/a.bin"] == 1 and origin.requests["/d/b.bin"] == 1, "once each"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{listener.port}/d/a.bin", headers={"Host": HOST}) as r:
                assert r.headers["X-Nezha-Cache"] == "hit" and len(await r.read()) == 300_000
    finally:
        await listener.close()


async def test_prefetch_of_a_url_with_a_volatile_parameter_asks_the_owner_of_the_key_the_node_stores_it_under(
        kube, ns, cluster, run_controller, index, origin, cache_nodes):
    """The controller keys a URL as the nodes do (the origin's volatile_params left out), so it asks the
    node that holds the object, and reports it stored."""
    from nezha.keys import cache_key, parse_target
    from nezha.ring import Ring

    table = [Origin(host=HOST, upstream=origin.url, volatile_params=("sig",))]
    ids = [f"{STS}-{i}" for i in range(3)]
    ring = Ring({i: 1 for i in ids})
    stored_owner = ring.owners(cache_key(parse_target("/d/c.bin", HOST)), 1)[0]
    # A signature whose unstripped key another node owns: asking that node is the bug.
    sig = next(s for s in (f"s{n}" for n in range(1000))
               if ring.owners(cache_key(parse_target(f"/d/c.bin?sig={s}", HOST)), 1)[0] != stored_owner)
    origin.put(f"/d/c.bin?sig={sig}", b"c" * 50_000, headers={"Cache-Control": "max-age=3600"})
    listeners = await cache_nodes(3, table)
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {node_id: f"127.0.0.{11 + i}:{listeners[i].port}" for i, node_id in enumerate(ids)})

    batch = client.BatchV1Api(kube)
    await batch.create_namespaced_job(ns, training_job("train-3", f"http://{HOST}/d/c.bin?sig={sig}"))
    status, _ = await job_done(batch, cluster.core, ns, "train-3")
    assert status == {"total": 1, "done": 1, "failed": [], "bytes": 50_000, "pinned": 50_000}
    assert origin.requests[f"/d/c.bin?sig={sig}"] == 1


async def test_each_url_a_batch_could_not_store_is_reported_with_the_nodes_reason_and_the_others_are_stored(
        kube, ns, cluster, run_controller, index, origin, redis_server, tmp_path):
    origin.put("/d/a.bin", b"a" * 5_000, headers={"Cache-Control": "max-age=3600"})
    origin.put("/d/moved", b"", status=302, headers={"Location": f"http://{HOST}/d/a.bin"})
    origin.put("/d/broken.bin", b"x" * 100_000, headers={"Cache-Control": "max-age=3600"}, die_after=1000)
    table = [Origin(host=HOST, upstream=origin.url)]
    node = build_node(CacheSettings(listen="127.0.0.1:0", data_dir=tmp_path / "n0", node_id=f"{STS}-0",
                                    redis_url=redis_server.url, origins=table))
    listener = Listener(node)
    await listener.start("127.0.0.1", 0)
    try:
        await cluster.create(1)
        cache_pod = pod(0)
        cache_pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": listener.port}]
        await cluster.core.create_namespaced_pod(ns, cache_pod)
        await cluster.set_ready(0, True, ip="127.0.0.1")
        controller = await run_controller(peer_address="pod-ip", origins=table)
        await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"})

        batch = client.BatchV1Api(kube)
        names = ("a.bin", "moved", "missing.bin", "broken.bin")
        await batch.create_namespaced_job(ns, training_job("train", ",".join(f"http://{HOST}/d/{n}" for n in names)))
        status, events = await job_done(batch, cluster.core, ns, "train")
        assert (status["total"], status["done"], status["bytes"]) == (4, 2, 10_000)
        reasons = {f["url"].rsplit("/", 1)[1]: f["reason"] for f in status["failed"]}
        assert reasons.keys() == {"missing.bin", "broken.bin"}
        assert reasons["missing.bin"] == (f"{STS}-0 passed it through (404, pass): the origin's answer may not "
                                          "be stored")
        assert reasons["broken.bin"].startswith(f"{STS}-0 answered 502: the fill of http://{HOST}/d/broken.bin "
                                                "ended unstored")
        warned = [e.message for e in events if e.type == "Warning"]
        assert all(any(name in w for w in warned) for name in ("missing.bin", "broken.bin"))
        assert origin.requests["/d/a.bin"] == 1, "the redirect's target and the URL itself: one fill"
        # All of it went in batches, each object's line saying stored or why not: no "stored yet?" asked.
        [fills] = controller.prefetcher._fill_batches.values()
        assert fills.objects == 4 and controller.prefetcher._stored_batches == {}
    finally:
        await listener.close()
