"""Each component as a real process, after a little work, and what its /metrics said.

A `nezha cache` node with the shared index (a real redis-server), capacity
small enough to evict, served a small load: misses, hits, a bypass, an
eviction. A `nezha controller` against the API double, which writes a ring
for two ready pods. A `nezha webhook` over TLS that answers one review it
patches and one it refuses. Started as the other integration tests start
them; nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.kubeapi.server import KubeAPI
from testkit.ports import free_port
from testkit.redis_server import RedisServer
from testkit.tools import require_tool
from testkit.waits import until_http
from tests.support_origin import TestOrigin

HOST = "www.cs.toronto.edu"
OBJECT = 64 * 1024


async def _text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as r:
        assert r.status == 200, f"{url}: {r.status}"
        return await r.text()


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.asynccontextmanager
async def running_node(workdir: Path, *, redis_url: str, origin_url: str):
    """A `nezha cache` process with the shared index and room for three objects; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(workdir / "node"),
         "--origin", f"{HOST}={origin_url}", "--redis-url", redis_url, "--capacity", str(3 * OBJECT),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "NEZHA_CLUSTER_TOKEN": "test-cluster-token"})
    base = f"http://127.0.0.1:{port}"
    try:
        await until_http(f"{base}/readyz", timeout=20, proc=proc, what="nezha cache")
        yield base
    finally:
        _stop(proc)


async def node_load(base: str) -> None:
    """Misses, hits (fast path and aiohttp's), ranges, a bypass and an eviction."""
    async with aiohttp.ClientSession() as s:
        for i in range(4):  # the fourth evicts the first (capacity: three)
            for headers in ({}, {}, {"Range": "bytes=0-9"}):
                async with s.get(f"{base}/data/{i}.bin", headers={"Host": HOST, **headers}) as r:
                    assert r.status in (200, 206), r.status
                    await r.read()
        # Credentials: passed through from the origin, never stored or served from disk.
        async with s.get(f"{base}/data/3.bin", headers={"Host": HOST, "Authorization": "Bearer t"}) as r:
            assert r.headers["X-Nezha-Cache"] == "bypass"
            await r.read()


async def cache_node(workdir: Path, *, redis_url: str, origin_url: str) -> str:
    """A node's /metrics after node_load."""
    async with running_node(workdir, redis_url=redis_url, origin_url=origin_url) as base:
        await node_load(base)
        async with aiohttp.ClientSession() as s:
            return await _text(s, f"{base}/metrics")


async def controller(workdir: Path, *, redis_url: str) -> str:
    """The controller's /metrics once it has written a ring for two ready pods."""
    from kubernetes_asyncio import client

    from tests.integration.controller.conftest import STS, Cluster

    api = KubeAPI(bookmark_interval=0.2)
    await api.start()
    kube = api.client()
    health = f"127.0.0.1:{free_port()}"
    proc = None
    try:
        ns = "nezha"
        await client.CoreV1Api(kube).create_namespace({"metadata": {"name": ns}})
        cluster = Cluster(kube, ns)
        await cluster.create(2)
        await cluster.add_pod(0)
        await cluster.add_pod(1)
        config = kubeconfig(workdir / "kubeconfig", api.url)
        proc = subprocess.Popen(
            [sys.executable, "-m", "nezha", "controller", "--namespace", ns, "--statefulset", STS,
             "--redis-url", redis_url, "--identity", "controller-a", "--kubeconfig", str(config),
             "--health-listen", health, "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await until_http(f"http://{health}/readyz", timeout=20, proc=proc, what="nezha controller")
        async with aiohttp.ClientSession() as s:
            for _ in range(400):
                text = await _text(s, f"http://{health}/metrics")
                if "nezha_controller_ring_writes_total 1.0" in text:
                    return text
                await asyncio.sleep(0.05)
        raise AssertionError("the controller wrote no ring within 20 s")
    finally:
        if proc is not None:
            _stop(proc)
        await kube.close()
        await api.stop()


async def webhook(workdir: Path) -> str:
    """The webhook's /metrics after one review it patched and one it refused (400)."""
    from tests.integration.webhook.conftest import RULES, TLSFiles
    from tests.integration.webhook.reviews import pod, review
    import trustme

    tls = TLSFiles(trustme.CA(), workdir)
    rules = workdir / "rules.yaml"
    rules.write_text(RULES)
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{port}", "--metrics-listen",
         f"127.0.0.1:{metrics}", "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--rules", str(rules),
         "--cache-ip", "10.96.0.10", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as c:
            await until_http(f"https://127.0.0.1:{port}/readyz", timeout=15, proc=proc, what="nezha webhook",
                             session=c)
            async with c.post(f"https://127.0.0.1:{port}/mutate", json=review(pod())) as r:
                assert r.status == 200 and "patch" in (await r.json())["response"]
            async with c.post(f"https://127.0.0.1:{port}/mutate", data=b"not json") as r:
                assert r.status == 400
        async with aiohttp.ClientSession() as s:
            return await _text(s, f"http://127.0.0.1:{metrics}/metrics")
    finally:
        _stop(proc)


@contextlib.asynccontextmanager
async def origin_and_redis(workdir: Path):
    """The origin (four 64 KiB files, fresh for an hour) and a redis-server; yields (origin URL, Redis URL)."""
    origin = TestOrigin()
    for i in range(4):
        origin.put(f"/data/{i}.bin", bytes([i]) * OBJECT, headers={"Cache-Control": "max-age=3600"})
    runner = web.AppRunner(origin.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    redis = RedisServer(require_tool("redis-server"), workdir)
    redis.start()
    try:
        yield f"http://127.0.0.1:{port}", redis.url
    finally:
        redis.stop(kill=True)
        await runner.cleanup()


async def scrape_all(workdir: Path) -> dict[str, str]:
    """component -> the text of its /metrics: cache, controller, webhook."""
    async with origin_and_redis(workdir) as (origin_url, redis_url):
        (workdir / "c").mkdir()
        (workdir / "w").mkdir()
        return {"cache": await cache_node(workdir, redis_url=redis_url, origin_url=origin_url),
                "controller": await controller(workdir / "c", redis_url=redis_url),
                "webhook": await webhook(workdir / "w")}
