"""The node's own answers about itself: /healthz, /readyz and /metrics, on
the data port (any Host that is not an origin) and on the admin port.

What /metrics waits for is given here at construction (`before_metrics`):
with --workers, the primary's links to its followers, built before the node
(cachenode/workers/primary.py), so a scrape counts every hit a follower
answered before it. Nothing is set on this object after it is built.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from cachenode.front.access import access
from cachenode.metrics import Metrics


class Admin:
    def __init__(self, *, metrics: Metrics, status: Callable[[], dict],
                 before_metrics: Callable[[], Awaitable[None]] | None = None) -> None:
        self.metrics = metrics
        self.status = status  # the node's /readyz answer; "ready" says whether it serves
        self.before_metrics = before_metrics

    async def answer(self, request: web.Request) -> web.Response:
        """/healthz, /readyz or /metrics, as `request.raw_path` names."""
        access(request).cache = "admin"
        if request.raw_path == "/healthz":
            return web.Response(text="ok\n")
        if request.raw_path == "/readyz":
            # Redis down is reported but does not make the node unready: it keeps serving.
            detail = self.status()
            return web.json_response(detail, status=200 if detail["ready"] else 503)
        if self.before_metrics is not None:
            await self.before_metrics()
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})
