"""`/_nezha/stored`: the controller asks, in one request, which of the prefetch fills it started here are stored.

    POST /_nezha/stored  {"objects": [{"key": "<cache key>", "object": "<Host><path>"}, ...]}
                         -> {"stored": {"<cache key>": size, ...}, "pending": ["<cache key>", ...]}

A prefetch of many small objects asked "stored yet?" once per object
(`HEAD` with `only-if-cached`): a second request for the node to parse,
route and log per object, as much of its time again as the fill's own
(bench/prefetch.py: 2.4 ms of node CPU an object against 1.8 for a
client's read). The controller now gathers the objects whose fill answered
on one node and asks for them together, one request for as many as are
pending then. Each is looked up in the store's index, and while its fill
still holds a pacing slot here (cachenode/front/pacing.py) the answer waits
for it, up to WAIT: looked at again 1 ms later, then 2, up to STEP apart.
A stored object gives its slot back, as a `check` that finds it does.
What is still pending the controller asks about with the `HEAD` as before
(an object stored as chunks, too large for one look, answers only that way).

Internal, like every `/_nezha/` path: the cluster token (front/routes.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web

from cachenode.front.pacing import Pacing

WAIT = 1.0  # seconds an answer waits at most for fills still running here
STEP = 0.02  # seconds between two looks, at most
MAX_OBJECTS = 10_000  # one request's objects


class StoredChecks:
    def __init__(self, *, pacing: Pacing, size_of: Callable[[str], int | None]) -> None:
        self.pacing = pacing
        self._size_of = size_of

    async def endpoint(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as e:
            raise web.HTTPBadRequest(text=f"/_nezha/stored: the body is not JSON ({e})\n") from e
        objects = body.get("objects") if isinstance(body, dict) else None
        if (not isinstance(objects, list) or len(objects) > MAX_OBJECTS
                or not all(isinstance(o, dict) and isinstance(o.get("key"), str) and isinstance(o.get("object"), str)
                           for o in objects)):
            raise web.HTTPBadRequest(text=f'/_nezha/stored: "objects" is not a list of at most {MAX_OBJECTS} '
                                          '{"key", "object"} strings\n')
        pending = {o["key"]: o["object"] for o in objects}
        stored: dict[str, int] = {}
        deadline = time.monotonic() + WAIT
        step = 0.001
        while True:
            for key, obj in list(pending.items()):
                size = self._size_of(key)
                if size is not None:
                    stored[key] = size
                    del pending[key]
                    self.pacing.stored(obj)
            if not any(self.pacing.filling(obj) for obj in pending.values()) or time.monotonic() + step > deadline:
                break
            await asyncio.sleep(step)
            step = min(step * 2, STEP)
        return web.json_response({"stored": stored, "pending": list(pending)})
