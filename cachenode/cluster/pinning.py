"""`/_nezha/pins`: the controller keeps a workload's prefetched objects from eviction on the node that holds them.

    POST /_nezha/pins  {"workload": "Job/ns/name", "pin": ["https://host/path", ...]}
                       -> {"pinned": n, "pinned_bytes": b, "refused": n, "refused_bytes": b, "missing": n,
                           "room": b | null}
    POST /_nezha/pins  {"workload": "Job/ns/name", "release": KEEP_SECONDS}  -> {"released": n}
    GET  /_nezha/pins  -> {"workloads": {"Job/ns/name": bytes, ...}, "capacity": b | null, "used": b}

The pins themselves are the store's (cachenode/store/pins.py): this is the
HTTP around them. Like every internal endpoint it needs the cluster token
(cachenode/front/routes.py).
"""

from __future__ import annotations

import dataclasses
import json

import structlog
from aiohttp import web

from cachenode.store.pins import Pins

log = structlog.get_logger("nezha.cachenode.pins")

MAX_KEYS = 100_000  # one request's keys: a controller sends a workload's objects per node, in batches


class Pinning:
    def __init__(self, *, pins: Pins) -> None:
        self.pins = pins

    async def endpoint(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.json_response({"workloads": self.pins.by_workload(), "capacity": self.pins.capacity,
                                      "used": self.pins.used()})
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"], text="GET or POST /_nezha/pins\n")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as e:
            raise web.HTTPBadRequest(text=f"/_nezha/pins: the body is not JSON ({e})\n") from e
        workload = body.get("workload") if isinstance(body, dict) else None
        if not isinstance(workload, str) or not workload:
            raise web.HTTPBadRequest(text='/_nezha/pins: "workload" (a string) is missing\n')
        if "release" in body:
            keep = body["release"]
            if not isinstance(keep, (int, float)) or isinstance(keep, bool) or keep < 0:
                raise web.HTTPBadRequest(text=f'/_nezha/pins: "release" is {keep!r}, not seconds to keep\n')
            released = self.pins.release(workload, float(keep))
            log.info("pins_released", workload=workload, objects=released, keep=keep)
            return web.json_response({"released": released})
        keys = body.get("pin")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(keys) > MAX_KEYS:
            raise web.HTTPBadRequest(text=f'/_nezha/pins: "pin" is not a list of at most {MAX_KEYS} keys\n')
        done = self.pins.pin(workload, keys)
        log.info("pins_added", workload=workload, **dataclasses.asdict(done))
        return web.json_response(dataclasses.asdict(done), dumps=json.dumps)
