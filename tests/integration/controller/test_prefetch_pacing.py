"""The controller's prefetch behind a node's live traffic: a fill the node told to ask again (it waited its
longest behind a live request, cachenode/front/pacing.py) is asked again, and every object is prefetched."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client

from cachenode.app import build_node
from cachenode.front.listener import Listener
from nezha.config import CacheSettings, Origin
from tests.integration.controller.conftest import STS, pod, ring_becomes
from tests.integration.controller.test_prefetch import HOST, job_done, training_job

LIVE = "live.example"


async def test_fills_told_to_wait_behind_a_live_request_are_asked_again_and_all_are_prefetched(
        kube, ns, cluster, run_controller, index, origin, redis_server, tmp_path, aiohttp_server):
    # Each object takes at least 0.4 s to arrive: the fills behind the first wait longer than the node's 0.1 s.
    for n in range(3):
        origin.put(f"/d/{n}.bin", bytes([n]) * 100_000, headers={"Cache-Control": "max-age=3600"}, rate=250_000)
    release = asyncio.Event()

    async def held(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(body=b"live")

    live_app = web.Application()
    live_app.router.add_get("/{tail:.*}", held)
    live_origin = await aiohttp_server(live_app, host="127.0.0.1")
    node = build_node(CacheSettings(listen="127.0.0.1:0", data_dir=tmp_path / "n0", node_id=f"{STS}-0",
                                    redis_url=redis_server.url, prefetch_busy_fills=1,
                                    origins=[Origin(host=HOST, upstream=origin.url),
                                             Origin(host=LIVE, upstream=f"http://127.0.0.1:{live_origin.port}")]))
    node.pacing.wait = 0.1
    listener = Listener(node)
    await listener.start("127.0.0.1", 0)
    live = None
    try:
        await cluster.create(1)
        cache_pod = pod(0)
        cache_pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": listener.port}]
        await cluster.core.create_namespaced_pod(ns, cache_pod)
        await cluster.set_ready(0, True, ip="127.0.0.1")
        await run_controller(peer_address="pod-ip")
        await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"})

        async with aiohttp.ClientSession() as s:
            live = asyncio.ensure_future(s.get(f"http://127.0.0.1:{listener.port}/x", headers={"Host": LIVE}))
            while node.pacing.live_in_flight == 0:  # a live request in flight on the node, all along
                await asyncio.sleep(0.01)
            batch = client.BatchV1Api(kube)
            urls = ",".join(f"http://{HOST}/d/{n}.bin" for n in range(3))
            await batch.create_namespaced_job(ns, training_job("paced", urls))
            status, _ = await job_done(batch, cluster.core, ns, "paced", timeout=60)
            assert node.pacing.live_in_flight == 1, "the live request was in flight all along"
            assert (status["done"], status["failed"], status["bytes"]) == (3, [], 300_000)
            assert node.pacing.told_to_wait >= 1 and node.pacing.started_while_live == 3
            assert [origin.requests[f"/d/{n}.bin"] for n in range(3)] == [1, 1, 1]
            release.set()
            async with await live as r:
                assert r.status == 200
    finally:
        release.set()
        if live is not None and not live.done():
            live.cancel()
        await listener.close()
