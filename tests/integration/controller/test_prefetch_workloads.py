"""nezha.io/prefetch on every workload kind that starts pods, made with the real kubectl.

Deployments and StatefulSets are built in; LeaderWorkerSets and JobSets are
served by the API double only once their CRDs are installed (as a cluster
serves them), and the controller watches them only where discovery finds
them. Fills are shared across workloads and paced.
"""

from __future__ import annotations

import asyncio
import json

from nezha.config import Origin
from testkit.kubeapi.resources import JOB_SETS, LEADER_WORKER_SETS
from tests.integration.controller.conftest import STS, ring_becomes
from tests.integration.controller.test_prefetch_names import REPO, hub, hub_origins, origin_gets  # noqa: F401

HOST = "data.example"
CONTAINER = {"name": "serve", "image": "server:1", "command": ["serve"]}


def template(app: str) -> dict:
    return {"metadata": {"labels": {"app": app}}, "spec": {"containers": [CONTAINER]}}


def deployment(name: str, prefetch: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "annotations": {"nezha.io/prefetch": prefetch}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}, "template": template(name)}}


def statefulset(name: str, prefetch: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "annotations": {"nezha.io/prefetch": prefetch}},
            "spec": {"replicas": 1, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": template(name)}}


def leader_worker_set(name: str, prefetch: str) -> dict:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "annotations": {"nezha.io/prefetch": prefetch}},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": template(name)}}}


def job_set(name: str, prefetch: str) -> dict:
    job = {"template": {"spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0,
                                 "template": {"spec": {"restartPolicy": "Never", "containers": [CONTAINER]}}}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "annotations": {"nezha.io/prefetch": prefetch}},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, **job}]}}


async def test_two_deployments_naming_one_model_fill_each_file_once_and_both_carry_its_status(
        kube_api, ns, run_controller, index, hub, one_node, kubectl):
    listener = await one_node(hub_origins(hub))
    await run_controller(peer_address="pod-ip", origins=hub_origins(hub))
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    await kubectl.create(deployment("serve-a", f"hf://{REPO}"), deployment("serve-b", f"hf://{REPO}@main"))
    first = await kubectl.prefetched("deployment", "serve-a")
    second = await kubectl.prefetched("deployment", "serve-b")
    size = sum(len(b) for b in hub.repo.files.values())
    assert (first["done"], first["total"], first["bytes"]) == (4, 4, size)
    assert (second["done"], second["total"], second["bytes"]) == (4, 4, size)
    fetched = origin_gets(hub)
    assert len(fetched) == 4 and set(fetched.values()) == {1}, f"one fill per file: {fetched}"
    # Only the annotation was written: the Deployment's generation did not move, so nothing rolled.
    assert json.loads(await kubectl("get", "deployment", "serve-a", "-o", "json"))["metadata"]["generation"] == 1


async def test_leaderworkersets_and_jobsets_are_prefetched_where_their_crds_are_installed(
        kube_api, ns, run_controller, index, origin, one_node, kubectl):
    for name in ("w.bin", "j.bin", "s.bin"):
        origin.put(f"/m/{name}", name.encode() * 10_000, headers={"Cache-Control": "max-age=3600"})
    kube_api.install_crd(LEADER_WORKER_SETS)
    kube_api.install_crd(JOB_SETS)
    table = [Origin(host=HOST, upstream=origin.url)]
    listener = await one_node(table)
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    await kubectl.create(leader_worker_set("llm", f"http://{HOST}/m/w.bin"),
                         job_set("pretrain", f"http://{HOST}/m/j.bin,http://{HOST}/m/w.bin"),
                         statefulset("shards", f"http://{HOST}/m/s.bin"))
    assert await kubectl.prefetched("leaderworkerset", "llm") == {"total": 1, "done": 1, "failed": [],
                                                                  "bytes": 50_000, "pinned": 50_000}
    assert (await kubectl.prefetched("jobset", "pretrain"))["done"] == 2
    assert (await kubectl.prefetched("statefulset", "shards"))["done"] == 1
    assert [origin.requests[f"/m/{n}"] for n in ("w.bin", "j.bin", "s.bin")] == [1, 1, 1]


async def test_without_their_crds_no_custom_kind_is_watched_and_the_built_in_kinds_still_are(
        kube_api, ns, run_controller, index, origin, one_node, kubectl):
    origin.put("/m/d.bin", b"d" * 1000, headers={"Cache-Control": "max-age=3600"})
    table = [Origin(host=HOST, upstream=origin.url)]
    listener = await one_node(table)
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)
    await kubectl.create(deployment("plain", f"http://{HOST}/m/d.bin"))
    assert (await kubectl.prefetched("deployment", "plain"))["done"] == 1
    asked = [path for _, path in kube_api.requests]
    assert any(p.startswith("/apis/apps/v1/deployments") for p in asked)
    assert not [p for p in asked if "leaderworkerset" in p or "jobset" in p]


async def test_a_large_expansion_keeps_at_most_prefetch_fills_in_flight(
        kube_api, ns, run_controller, index, origin, one_node, kubectl):
    names = [f"/many/{i}.bin" for i in range(12)]
    for path in names:
        origin.put(path, b"x" * 20_000, headers={"Cache-Control": "max-age=3600"}, rate=200_000)
    origin.put("/many/files.txt", "\n".join(f"http://{HOST}{p}" for p in names).encode())
    table = [Origin(host=HOST, upstream=origin.url)]
    listener = await one_node(table)
    controller = await run_controller(peer_address="pod-ip", origins=table, prefetch_fills=3)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)
    seen: list[dict[str, float]] = []

    at_node: list[int] = []  # fills waiting on the node for a slot

    async def sample() -> None:
        while True:
            seen.append(fills_gauge(controller))
            at_node.append(listener.node.pacing.waiting)
            await asyncio.sleep(0.02)

    sampler = asyncio.get_running_loop().create_task(sample())
    await kubectl.create(deployment("many-a", f"http://{HOST}/many/files.txt"),
                         deployment("many-b", f"http://{HOST}/many/files.txt"))
    assert (await kubectl.prefetched("deployment", "many-a"))["done"] == 12
    assert (await kubectl.prefetched("deployment", "many-b"))["done"] == 12
    sampler.cancel()
    assert all(origin.requests[p] == 1 for p in names)
    # Each fill takes 0.1 s at the origin's rate: with 12 of them, three at a time is what was asked for.
    # (Counted of the objects alone: a workload's manifest may be read while the other's fills run.)
    assert origin.most_at_once(lambda path: path.endswith(".bin")) == 3
    # The metric says so as it happens: six asked of the node at most (three running there, the next
    # three waiting there for a slot), the rest queued here, nothing left at the end.
    assert max(s["in_flight"] for s in seen) == 6
    assert max(at_node) == 3, "the node held the next three, to start each as a slot was given back"
    assert max(s["queued"] for s in seen) >= 9
    assert fills_gauge(controller) == {"in_flight": 0, "queued": 0}
    # Filled in batches (/_nezha/prefetch) that said when each was stored: no ranged GET and no
    # "stored yet?" an object (those go the ordinary way, and ask in /_nezha/stored batches).
    [batch] = controller.prefetcher._fill_batches.values()
    assert not batch.unsupported and batch.objects == 12 and 1 <= batch.requests <= 12
    assert controller.prefetcher._stored_batches == {}
    assert listener.node.pacing.started_while_live == 0, "the prefetch's own requests are no live traffic"


async def test_a_fill_that_fails_amid_the_others_leaves_every_other_object_stored_and_the_status_right(
        kube_api, ns, run_controller, index, origin, one_node, kubectl):
    names = [f"/mixed/{i}.bin" for i in range(9)]
    for path in names:
        origin.put(path, b"m" * 20_000, headers={"Cache-Control": "max-age=3600"}, delay=0.05,
                   **({"die_after": 100} if path == "/mixed/4.bin" else {}))
    origin.put("/mixed/files.txt", "\n".join(f"http://{HOST}{p}" for p in names).encode())
    table = [Origin(host=HOST, upstream=origin.url)]
    listener = await one_node(table)
    controller = await run_controller(peer_address="pod-ip", origins=table, prefetch_fills=2)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)
    await kubectl.create(deployment("mixed", f"http://{HOST}/mixed/files.txt"))
    status = await kubectl.prefetched("deployment", "mixed")
    assert (status["total"], status["done"], status["bytes"]) == (9, 8, 8 * 20_000)
    [failed] = status["failed"]
    assert failed["url"] == f"http://{HOST}/mixed/4.bin" and "502" in failed["reason"]
    assert origin.most_in_flight == 2
    # Every other object stored once, read back as a hit; the broken one asked again by the ordinary way
    # at most (a batch's `failed` line is final: no second ask).
    assert all(origin.requests[p] == 1 for p in names if p != "/mixed/4.bin")
    for path in names:
        if path != "/mixed/4.bin":
            assert listener.node.store.stored_size(f"http://{HOST}{path}") == 20_000
    warnings = json.loads(await kubectl("get", "events", "-o", "json"))["items"]
    assert [e["message"] for e in warnings if e["reason"] == "PrefetchFailed"] == [
        f"nezha.io/prefetch: {failed['url']}: {failed['reason']}"]
    assert listener.node.pacing.running == 0 and listener.node.pacing.waiting == 0, "every slot given back"
    assert fills_gauge(controller) == {"in_flight": 0, "queued": 0}


def fills_gauge(controller) -> dict[str, float]:
    """`nezha_controller_prefetch_fills` by state, as a scrape of the controller reads it."""
    out = {}
    for line in controller.metrics.render().decode().splitlines():
        if line.startswith("nezha_controller_prefetch_fills{"):
            state = line.split('state="', 1)[1].split('"', 1)[0]
            out[state] = float(line.rsplit(" ", 1)[1])
    return out
