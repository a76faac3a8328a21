"""nezha.io/prefetch-spread: all: every node holds each prefetched object (a hot copy where it is no owner)."""

from __future__ import annotations

from kubernetes_asyncio import client

from nezha.config import Origin
from nezha.keys import key_for, parse_target
from tests.integration.controller.conftest import STS, ring_becomes
from tests.integration.controller.test_prefetch import job_done, training_job

HOST = "models.example"


async def test_spread_all_copies_each_object_to_every_node_once_filled_and_leaves_larger_ones_to_their_owner(
        kube, ns, cluster, run_controller, index, origin, cache_nodes):
    for name, size in (("config.json", 2_000), ("weights.bin", 300_000), ("huge.bin", 900_000)):
        origin.put(f"/m/{name}", name[0].encode() * size, headers={"Cache-Control": "max-age=3600"})
    table = [Origin(host=HOST, upstream=origin.url)]
    ids = [f"{STS}-{i}" for i in range(3)]
    listeners = await cache_nodes(3, table, capacity=10_000_000, hot_reads=0)
    await run_controller(peer_address="pod-ip", origins=table, prefetch_spread_max=500_000)
    await ring_becomes(index, {n: f"127.0.0.{11 + i}:{listeners[i].port}" for i, n in enumerate(ids)}, timeout=10)

    batch = client.BatchV1Api(kube)
    job = training_job("serve", ",".join(f"http://{HOST}/m/{n}" for n in ("config.json", "weights.bin",
                                                                          "huge.bin")))
    job["metadata"]["annotations"]["nezha.io/prefetch-spread"] = "all"
    await batch.create_namespaced_job(ns, job)
    status, events = await job_done(batch, cluster.core, ns, "serve")
    assert status["done"] == 3
    assert status["spread"] == {"objects": 2, "copies": 4, "failed": 0, "larger_than_max": 1}, status
    assert not [e for e in events if e.type == "Warning"]

    for name, everywhere in (("config.json", True), ("weights.bin", True), ("huge.bin", False)):
        key = key_for(parse_target(f"/m/{name}", HOST), table[0])
        held = [listener.node.store.lookup(key) for listener in listeners]
        assert sum(m is not None and not m.hot for m in held) == 1, (name, "one owner's copy")
        assert all(m is not None for m in held) == everywhere, (name, [m is not None for m in held])
        assert origin.requests[f"/m/{name}"] == 1, "copies come from the owner, not the origin"
