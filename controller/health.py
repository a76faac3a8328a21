"""`/healthz` and `/readyz` of the controller, for the kubelet's probes, and
`/metrics` for Prometheus (controller/metrics.py).

Liveness is the reconcile loop going round: it wakes at least every RESYNC
seconds, so a loop that has not come back for much longer than that is
wedged, and a restart is the cure. Readiness is having listed the
StatefulSet once (the API server answered): a standby is ready too, since
readiness gates nothing but the Deployment's rollout and the PDB, and a
rollout that waited for leadership would never finish.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

if TYPE_CHECKING:
    from controller.run import Controller

log = structlog.get_logger("nezha.controller")


def build_app(controller: "Controller", *, stuck_after: float) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        idle = controller.loop_idle()
        if idle is not None and idle > stuck_after:
            return web.json_response({"ok": False, "why": f"the reconcile loop has not run for {idle:.0f}s"},
                                     status=503)
        return web.json_response({"ok": True})

    async def readyz(request: web.Request) -> web.Response:
        synced = controller.statefulsets.synced.is_set()
        body = {"ready": synced, "leading": controller.leading, "statefulset": controller.name,
                "statefulset_seen": controller.statefulset is not None,
                "members": sorted(controller.written[0]) if controller.written else None}
        if not synced:
            body["why"] = "the StatefulSet has not been listed yet (API server not reached)"
        return web.Response(text=json.dumps(body), content_type="application/json",
                            status=200 if synced else 503)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=controller.metrics.render(),
                            headers={"Content-Type": controller.metrics.content_type})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def start(controller: "Controller", listen: tuple[str, int], *, stuck_after: float) -> web.AppRunner:
    runner = web.AppRunner(build_app(controller, stuck_after=stuck_after), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, listen[0], listen[1], reuse_address=True)
    await site.start()
    log.info("health_listening", listen=f"{listen[0]}:{listen[1]}")
    return runner
