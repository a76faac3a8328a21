"""Pods of a `nezha.io/prefetch-spread: all` workload wait at their scheduling gate until the spread is done.

The API double calls the webhook over TLS, as kube-apiserver does: the Job
is admitted (its pod template gets `nezha.io/prefetch-for`), the double's
Job controller creates its pod through admission (the pod gets the gate
`nezha.io/prefetch` and stays Pending, SchedulingGated), and the
controller removes the gate once every node holds the objects, or after
`--prefetch-gate-wait` with a Warning Event.
"""

from __future__ import annotations

import asyncio
import time

from kubernetes_asyncio import client

from nezha.config import Origin
from nezha.keys import key_for, parse_target
from tests.integration.controller.conftest import STS, ring_becomes
from tests.integration.controller.test_prefetch import job_done, training_job
from tests.integration.webhook.conftest import rules_file, tls, webhook  # noqa: F401  (fixtures)
from tests.integration.webhook.registration import register

HOST = "models.example"
NAMES = ("config.json", "weights.bin")


async def job_pod(core: client.CoreV1Api, ns: str, job: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = (await core.list_namespaced_pod(ns, label_selector=f"job-name={job}")).items
        if pods:
            return pods[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no pod of Job {job} within {timeout} s")


def gated(pod) -> bool:
    return any(g.name == "nezha.io/prefetch" for g in pod.spec.scheduling_gates or [])


async def until_let_go(core: client.CoreV1Api, ns: str, name: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = await core.read_namespaced_pod(name, ns)
        if not gated(pod):
            return pod
        await asyncio.sleep(0.01)
    raise AssertionError(f"pod {name} still gated after {timeout} s")


async def spreading_cluster(kube, ns, run_controller, index, origin, cache_nodes, webhook, tls,  # noqa: F811
                            *, delay: float = 0.0, held: asyncio.Event | None = None, **controller):
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"{webhook.url}/mutate")
    for name in NAMES:
        origin.put(f"/m/{name}", name[0].encode() * 50_000, headers={"Cache-Control": "max-age=3600"}, delay=delay,
                   held=held)
    table = [Origin(host=HOST, upstream=origin.url)]
    listeners = await cache_nodes(3, table, capacity=10_000_000, hot_reads=0)
    await run_controller(peer_address="pod-ip", origins=table, **controller)
    ids = [f"{STS}-{i}" for i in range(3)]
    await ring_becomes(index, {n: f"127.0.0.{11 + i}:{listeners[i].port}" for i, n in enumerate(ids)}, timeout=10)
    job = training_job("serve", ",".join(f"http://{HOST}/m/{n}" for n in NAMES))
    job["metadata"]["annotations"]["nezha.io/prefetch-spread"] = "all"
    await client.BatchV1Api(kube).create_namespaced_job(ns, job)
    return table, listeners


async def test_the_pod_is_created_gated_and_scheduled_only_once_every_node_holds_every_object(
        kube, kube_api, ns, cluster, run_controller, index, origin, cache_nodes, webhook, tls):  # noqa: F811
    table, listeners = await spreading_cluster(kube, ns, run_controller, index, origin, cache_nodes, webhook, tls,
                                               delay=0.5)
    pod = await job_pod(cluster.core, ns, "serve")
    assert gated(pod), "created with the gate (webhook/gate.py)"
    assert pod.metadata.annotations["nezha.io/prefetch-for"] == "Job/serve"
    [scheduled] = [c for c in pod.status.conditions if c.type == "PodScheduled"]
    assert (scheduled.status, scheduled.reason) == ("False", "SchedulingGated")

    let_go = await until_let_go(cluster.core, ns, pod.metadata.name, timeout=30)
    keys = [key_for(parse_target(f"/m/{n}", HOST), table[0]) for n in NAMES]
    assert all(listener.node.store.lookup(k) is not None for listener in listeners for k in keys), \
        "let go only once each node holds each object"
    assert let_go.metadata.labels["nezha.io/prefetch-gated"] == "true"
    status, events = await job_done(client.BatchV1Api(kube), cluster.core, ns, "serve")
    assert status["spread"] == {"objects": 2, "copies": 4, "failed": 0, "larger_than_max": 0}
    pod_events = [e for e in (await cluster.core.list_namespaced_event(ns)).items
                  if e.involved_object.name == pod.metadata.name]
    assert not [e for e in pod_events if e.type == "Warning"], "on time: no Warning"
    assert [c.review["request"]["kind"]["kind"] for c in kube_api.admission_calls
            if c.review["request"]["namespace"] == ns and c.review["request"]["kind"]["kind"] != "Event"][-2:] == \
        ["Job", "Pod"]


async def test_a_pod_whose_spread_is_not_done_in_time_is_let_go_with_a_warning(
        kube, kube_api, ns, cluster, run_controller, index, origin, cache_nodes, webhook, tls):  # noqa: F811
    # The objects are held at the origin until the pod is let go: it was let go at its wait's end (1 s),
    # never because the spread was done.
    held = asyncio.Event()
    await spreading_cluster(kube, ns, run_controller, index, origin, cache_nodes, webhook, tls, held=held,
                            prefetch_gate_wait=1.0)
    pod = await job_pod(cluster.core, ns, "serve")
    assert gated(pod)
    await until_let_go(cluster.core, ns, pod.metadata.name, timeout=30)
    assert origin.requests["/m/weights.bin"] <= 1 and "PrefetchDone" not in [
        e.reason for e in (await cluster.core.list_namespaced_event(ns)).items], "the prefetch still runs"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        warnings = [e for e in (await cluster.core.list_namespaced_event(ns)).items
                    if e.involved_object.name == pod.metadata.name and e.reason == "PrefetchGateTimeout"]
        if warnings:
            break
        await asyncio.sleep(0.05)
    [warning] = warnings
    assert warning.type == "Warning" and "Job/" in warning.message and "--prefetch-gate-wait" in warning.message
    held.set()
