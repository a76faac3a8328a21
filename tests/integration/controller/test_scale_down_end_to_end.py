"""kubectl scale 5 -> 2 with everything real but the API server: the controller, five `nezha cache`
processes on their own loopback addresses, a real redis-server, and the test doing what the
StatefulSet controller and the kubelet do (graceful delete, SIGTERM, the zero-grace delete).

The kubelet's SIGKILL after the grace period is not done by the clock here: a node keeps within
that period by its own timers (`shutdown_grace` under it, `leave_settle`), and the tests check what
ended each of its waits (the drain's Events, its `node_leaving` line), not the seconds a loaded
machine takes; `kubelet_stops` kills only a node that hangs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from testkit.logs import log_events
from testkit.ports import free_port
from testkit.waits import START_GUARD, until_http, until_reported
from tests.integration.controller.conftest import STS, events_about, pod, ring_becomes

HOST = "www.cs.toronto.edu"
GRACE = 20  # terminationGracePeriodSeconds of the cache pods in this test
LEAVE_SETTLE = 2.0  # seconds a node given SIGTERM waits for a ring without it
# Seconds a node given SIGTERM has before `kubelet_stops` kills it: a hang guard, never what a test passes
# by. Past a node's longest way out (a hand-off cut at GRACE - 5), under the tests' own timeout.
EXIT_GUARD = 60
TOKEN = "e2e-cluster-token"


def start_node(i: int, *, port: int, redis_url: str, origin_url: str, data: Path) -> subprocess.Popen:
    ip = f"127.0.0.{11 + i}"
    env = {**os.environ, "NEZHA_CLUSTER_TOKEN": TOKEN, "NEZHA_LEAVE_SETTLE": str(LEAVE_SETTLE),
           "NEZHA_SHUTDOWN_GRACE": str(GRACE - 5)}
    log = open(data / f"node-{i}.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "nezha", "cache", "--listen", f"{ip}:{port}", "--advertise", f"{ip}:{port}",
         "--node-id", f"{STS}-{i}", "--data-dir", str(data / f"node-{i}"), "--redis-url", redis_url,
         "--replicas", "1", "--origin", f"{HOST}={origin_url}", "--log-level", "info",
         # One process a pod, as `nezha up` starts its nodes: five pods of the default `auto` are
         # fifteen interpreters starting at once on this machine's two cores.
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env)


async def kubelet_stops(cluster, ns: str, i: int, proc: subprocess.Popen) -> None:
    """Graceful delete, SIGTERM, the exit (SIGKILL only after EXIT_GUARD), then the kubelet's zero-grace delete."""
    guard = time.monotonic() + EXIT_GUARD
    await cluster.core.delete_namespaced_pod(f"{STS}-{i}", ns)  # deletionTimestamp, MODIFIED
    proc.send_signal(signal.SIGTERM)
    while proc.poll() is None and time.monotonic() < guard:
        await asyncio.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    await cluster.core.delete_namespaced_pod(f"{STS}-{i}", ns, grace_period_seconds=0)


class CachePods:
    """Node processes, their pods in the API double, and the controller; objects cached through node 0."""

    def __init__(self, procs: list[subprocess.Popen], urls: list[str]) -> None:
        self.procs, self.urls = procs, urls


@pytest.fixture
async def cache_pods(cluster, run_controller, index, ns, origin, redis_server, tmp_path):
    started: list[subprocess.Popen] = []

    async def start(n: int, paths: list[str]) -> CachePods:
        for p in paths:
            origin.put(p, p.encode() * 2000, headers={"Cache-Control": "max-age=3600"})
        ports = [free_port() for _ in range(n)]
        procs = [start_node(i, port=ports[i], redis_url=redis_server.url, origin_url=origin.url, data=tmp_path)
                 for i in range(n)]
        started.extend(procs)
        urls = [f"http://127.0.0.{11 + i}:{ports[i]}" for i in range(n)]
        await asyncio.gather(*(until_http(u + "/healthz", timeout=START_GUARD, proc=p, what="nezha cache")
                               for u, p in zip(urls, procs)))
        await cluster.create(n)
        for i in range(n):
            cache_pod = pod(i)
            cache_pod["spec"]["nodeName"] = "node-a"
            cache_pod["spec"]["terminationGracePeriodSeconds"] = GRACE
            cache_pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": ports[i]}]
            await cluster.core.create_namespaced_pod(ns, cache_pod)
            await cluster.set_ready(i, True, ip=f"127.0.0.{11 + i}")
        await run_controller(peer_address="pod-ip")
        ring = {f"{STS}-{i}": f"127.0.0.{11 + i}:{ports[i]}" for i in range(n)}
        await ring_becomes(index, ring)  # RING_WAIT, a guard: 2 s was a speed claim on a setup step
        # Every node routes by that ring (it reads it from the watch): as each reports, not after a clock.
        await asyncio.gather(*(until_reported(u + "/readyz", lambda st: sorted(st["ring_nodes"]) == sorted(ring),
                                              proc=p, what="nezha cache") for u, p in zip(urls, procs)))
        async with aiohttp.ClientSession() as s:
            for p in paths:
                async with s.get(urls[0] + p, headers={"Host": HOST}) as r:
                    assert r.status == 200 and await r.read() == p.encode() * 2000
        # Every fill committed: a flight lands after its object is renamed into place.
        await asyncio.gather(*(until_reported(u + "/readyz", lambda st: st["fills_in_flight"] == 0,
                                              proc=p, what="nezha cache") for u, p in zip(urls, procs)))
        return CachePods(procs, urls)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
    for proc in started:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def test_scale_from_five_to_two_serves_everything_cached_with_zero_origin_fetches(
        cache_pods, cluster, index, ns, origin, tmp_path):
    paths = [f"/train/shard-{n:03d}" for n in range(40)]
    pods = await cache_pods(5, paths)
    fetched = sum(origin.requests.values())
    assert fetched == len(paths)
    leaving_held = sum(len([q for q in (tmp_path / f"node-{i}").rglob("*") if q.suffix in (".data", ".obj")])
                       for i in (2, 3, 4))
    assert leaving_held > 0

    # kubectl scale statefulset nezha-cache --replicas=2
    await cluster.apps.patch_namespaced_stateful_set_scale(STS, ns, {"spec": {"replicas": 2}})
    await asyncio.gather(*(kubelet_stops(cluster, ns, i, pods.procs[i]) for i in (4, 3, 2)))
    assert all(pods.procs[i].returncode == 0 for i in (2, 3, 4)), "each leaving node exited by itself"
    # Each within its grace period: its hand-off ended by finishing, not by its shutdown_grace timer (GRACE - 5),
    # which the DrainFinished Events below say, three of them and no DrainFailed ("hand-off timed out").
    await ring_becomes(index, {f"{STS}-{i}": pods.urls[i].removeprefix("http://") for i in range(2)})
    await asyncio.gather(*(until_reported(pods.urls[i] + "/readyz",
                                          lambda st: st["ring_nodes"] == [f"{STS}-0", f"{STS}-1"],
                                          proc=pods.procs[i], what="nezha cache") for i in range(2)))

    async with aiohttp.ClientSession() as s:
        for url in pods.urls[:2]:
            for p in paths:
                async with s.get(url + p, headers={"Host": HOST}) as r:
                    assert r.status == 200 and await r.read() == p.encode() * 2000, (url, p)
    assert sum(origin.requests.values()) == fetched, "not one origin fetch after the scale-down"

    started = await events_about(cluster, reason="DrainStarted", count=3)
    finished = await events_about(cluster, reason="DrainFinished", count=3)
    assert sorted(e.message.split()[0] for e in started) == [f"{STS}-{i}" for i in (2, 3, 4)]
    assert sorted(e.message.split()[0] for e in finished) == [f"{STS}-{i}" for i in (2, 3, 4)]
    assert sum(int(e.message.split("handed off ")[1].split()[0]) for e in finished) == leaving_held
    assert await events_about(cluster, reason="DrainFailed", timeout=0) == []


async def test_a_rolling_restart_of_one_pod_hands_nothing_off_and_keeps_its_data(cache_pods, cluster, ns, tmp_path):
    """A pod deleted with replicas unchanged leaves the ring while it terminates, but is not leaving for good."""
    pods = await cache_pods(3, [f"/train/r-{n:02d}" for n in range(15)])
    held = sorted(q.name for q in (tmp_path / "node-1").rglob("*") if q.suffix in (".data", ".obj"))
    assert held, "node-1 owns some of them"
    await kubelet_stops(cluster, ns, 1, pods.procs[1])
    assert pods.procs[1].returncode == 0, "it exited by itself"
    # Promptly: its one wait on the way out, for a ring without it, was bounded by leave_settle (not by
    # shutdown_grace) and ended by that ring (the controller's, not naming it leaving) or that timer; no
    # hand-off followed.
    [leaving] = log_events(tmp_path / "node-1.log", "node_leaving")
    assert leaving["reason"] == "not leaving for good: a restart keeps its disk", leaving
    assert (leaving["handoff"], leaving["settle_seconds"]) == (False, LEAVE_SETTLE), leaving
    assert log_events(tmp_path / "node-1.log", "handoff_started") == []
    assert sorted(q.name for q in (tmp_path / "node-1").rglob("*") if q.suffix in (".data", ".obj")) == held
