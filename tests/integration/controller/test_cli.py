"""`nezha controller` as a process: the command line is a contract."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import pytest

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.ports import free_port
from testkit.waits import START_GUARD
from tests.integration.controller.conftest import STS, dns, ring_becomes


def nezha(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nezha", *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,names", [
    (["--statefulset", STS, "--redis-url", "redis://127.0.0.1:1/0"], "--namespace"),
    (["--namespace", "nezha", "--redis-url", "redis://127.0.0.1:1/0"], "--statefulset"),
    (["--namespace", "nezha", "--statefulset", STS], "--redis-url"),
    (["--namespace", "nezha", "--statefulset", STS, "--redis-url", "http://127.0.0.1:1"], "--redis-url"),
    (["--namespace", "nezha", "--statefulset", STS, "--redis-url", "redis://127.0.0.1:1/0",
      "--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig"),
    (["--namespace", "nezha", "--statefulset", STS, "--redis-url", "redis://127.0.0.1:1/0",
      "--health-listen", "nope"], "--health-listen"),
    (["--namespace", "Not_A_Name", "--statefulset", STS, "--redis-url", "redis://127.0.0.1:1/0"], "--namespace"),
])
def test_bad_settings_exit_2_with_one_line_naming_the_flag(args, names):
    run = nezha("controller", *args, env={"KUBECONFIG": "", "NEZHA_NAMESPACE": ""})
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and names in lines[0], run.stderr


def test_no_kubeconfig_and_no_service_account_is_exit_2_naming_both():
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    run = subprocess.run([sys.executable, "-m", "nezha", "controller", "--namespace", "nezha", "--statefulset",
                          STS, "--redis-url", "redis://127.0.0.1:1/0"], capture_output=True, text=True,
                         timeout=30, env=env)
    assert run.returncode == 2
    assert "service account" in run.stderr and "--kubeconfig" in run.stderr


async def test_the_process_writes_the_ring_and_stops_on_sigterm(cluster, index, kube_api, ns, redis_server,
                                                                tmp_path):
    await cluster.create(2)
    await cluster.add_pod(0)
    await cluster.add_pod(1)
    config = kubeconfig(tmp_path / "kubeconfig", kube_api.url)
    health = f"127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nezha", "controller", "--namespace", ns, "--statefulset", STS,
        "--redis-url", redis_server.url, "--identity", "controller-a", "--kubeconfig", str(config),
        "--health-listen", health,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)}, timeout=10.0)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{health}/healthz") as r:
                assert r.status == 200
            async with http.get(f"http://{health}/readyz") as r:
                ready = await r.json()
                assert r.status == 200 and ready["leading"] is True, ready
                assert ready["members"] == ["nezha-cache-0", "nezha-cache-1"]
        await cluster.set_ready(0, False)
        await ring_becomes(index, {"nezha-cache-1": dns(1, ns)}, timeout=10.0)  # a wait, not a claim of speed
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, out.decode()[-2000:]
    assert b'"ring_updated"' in out or b"ring_updated" in out


async def test_redis_not_answering_yet_is_retried_not_an_exit(cluster, kube_api, ns, redis_server, tmp_path):
    from nezha.index.handle import Index

    await cluster.create(1)
    await cluster.add_pod(0)
    redis_server.stop()
    config = kubeconfig(tmp_path / "kubeconfig", kube_api.url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nezha", "controller", "--namespace", ns, "--statefulset", STS,
        "--redis-url", redis_server.url, "--kubeconfig", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        await asyncio.sleep(1.5)
        assert proc.returncode is None, "a Redis that does not answer yet is no reason to exit"
        redis_server.start()
        idx = Index(redis_url=redis_server.url, node_id=None)
        try:
            # What is proved is that it writes the ring once Redis answers, not how soon: the
            # deadline is a hang guard (testkit/waits.py), as the controller's start on a loaded
            # machine and its Redis back-off together can take longer than any fixed guess.
            await ring_becomes(idx, {"nezha-cache-0": dns(0, ns)}, timeout=START_GUARD)
        finally:
            await idx.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), START_GUARD)


async def test_two_processes_with_default_timings_fail_over_by_the_lease_running_out_after_a_sigkill(
        cluster, index, kube, kube_api, ns, redis_server, tmp_path):
    """The standby takes the Lease the way the promise (about 17 s, within 25 s, docs/controller.md) rests on:
    the default lease_duration (15 s) in force, and taken because that long passed without a renewal
    (leaseTransitions one up, its acquireTime no sooner), then the next ring change written. The seconds it
    took on this machine are not asserted: a loaded box delays every process alike, and the guard on the ring
    wait only stops a hang."""
    from kubernetes_asyncio import client

    await cluster.create(2)
    await cluster.add_pod(0)
    config = kubeconfig(tmp_path / "kubeconfig", kube_api.url)
    procs = {}
    for identity in ("controller-a", "controller-b"):
        procs[identity] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nezha", "controller", "--namespace", ns, "--statefulset", STS,
            "--redis-url", redis_server.url, "--identity", identity, "--kubeconfig", str(config),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    leases = client.CoordinationV1Api(kube)
    try:
        await ring_becomes(index, {"nezha-cache-0": dns(0, ns)}, timeout=10.0)
        leader = (await leases.read_namespaced_lease("nezha-controller", ns)).spec.holder_identity
        standby = next(i for i in procs if i != leader)
        procs[leader].kill()
        await procs[leader].wait()
        last = (await leases.read_namespaced_lease("nezha-controller", ns)).spec  # its last renewal
        assert last.holder_identity == leader and last.lease_duration_seconds == 15
        await cluster.add_pod(1)
        await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)}, timeout=START_GUARD)
        taken = (await leases.read_namespaced_lease("nezha-controller", ns)).spec
        assert taken.holder_identity == standby and taken.lease_transitions == last.lease_transitions + 1
        assert (taken.acquire_time - last.renew_time).total_seconds() >= last.lease_duration_seconds
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 10)


async def test_a_redis_outage_is_one_warning_event_and_recovery_a_normal_one(cluster, run_controller, index,
                                                                             redis_server, ns):
    from tests.integration.controller.conftest import events_about

    await cluster.create(2)
    await cluster.add_pod(0)
    await run_controller()
    await ring_becomes(index, {"nezha-cache-0": dns(0, ns)})
    redis_server.stop(kill=True)
    await cluster.add_pod(1)  # a change the controller cannot write
    [warning] = await events_about(cluster, reason="RingWriteFailed", timeout=5.0)
    assert warning.type == "Warning" and "retrying" in warning.message
    redis_server.start()
    await ring_becomes(index, {f"nezha-cache-{i}": dns(i, ns) for i in (0, 1)}, timeout=15.0)
    [recovered] = await events_about(cluster, reason="RingWriteRecovered", timeout=5.0)
    assert recovered.type == "Normal"
    assert len(await events_about(cluster, reason="RingWriteFailed", timeout=0)) == 1, "one per outage"


async def test_health_fails_when_the_reconcile_loop_stops_going_round(cluster, run_controller):
    """Liveness is the loop turning, not the process answering: a wedged loop gets the pod restarted."""
    from controller import health

    await cluster.create(1)
    controller = await run_controller()
    app = health.build_app(controller, stuck_after=60.0)
    from aiohttp.test_utils import TestClient, TestServer
    async with TestClient(TestServer(app)) as http:
        for _ in range(100):
            if controller.statefulsets.synced.is_set():
                break
            await asyncio.sleep(0.05)
        assert (await http.get("/healthz")).status == 200
        assert (await http.get("/readyz")).status == 200
        # Wedge the loop for real (a pass that never returns), then let a minute pass on its clock: moving
        # loop_at back alone raced with the loop going round, which set it again.
        wedged = asyncio.Event()

        async def never_returns() -> None:
            wedged.set()
            await asyncio.Event().wait()

        controller.reconcile = never_returns
        controller._wake.set()
        await asyncio.wait_for(wedged.wait(), 30.0)
        clock = controller._clock
        controller._clock = lambda: clock() + 61.0
        r = await http.get("/healthz")
        assert r.status == 503 and "has not run for" in (await r.json())["why"]


async def test_a_stop_that_lands_as_the_loop_is_woken_still_stops_it(cluster, run_controller):
    """On Python 3.11, asyncio.wait_for returns the result of an inner wait that
    completed in the same step as its cancellation, and drops the cancellation:
    the reconcile loop then outlived SIGTERM (a flaky hang in CI)."""
    await cluster.create(1)
    await cluster.add_pod(0)
    controller = await run_controller(elected=True)
    await asyncio.sleep(0.5)
    for _ in range(20):
        await asyncio.sleep(0.05)
        controller._wake.set()  # a change arrives ...
        controller.test_task.cancel()  # ... in the same step as the stop
        done, _ = await asyncio.wait({controller.test_task}, timeout=3)
        if done:
            break
    assert controller.test_task.done(), "the controller ignored its cancellation"
