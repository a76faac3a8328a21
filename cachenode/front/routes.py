"""One route table for the paths a node answers itself, not an origin's:
the probes and metrics (admin) and the endpoints peers and the cluster's
tools call (internal, cluster token). A request for an origin never
reaches them: they answer only on a Host that names no origin.

A chunk, the third kind of request a node answers for its own sake, is
asked with an origin's Host and path (its key is the object's), so it is
told apart by a field, not a path: `front/route.py`'s first row.

Every internal endpoint is refused here, once, to a caller without the
cluster token (peers/auth.py); an unknown internal path is a 404
naming it, as is a method its path does not take, except where the path
says which it takes (405).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

from aiohttp import web

from cachenode.cluster.handoff import Handoff
from cachenode.cluster.invalidation import Invalidation
from cachenode.peers.auth import refuse_internal
from cachenode.cluster.replica_intake import ReplicaIntake
from cachenode.cluster.pinning import Pinning
from cachenode.front.prefetch_fills import PrefetchFills
from cachenode.front.stored_checks import StoredChecks
from cachenode.front.access import access
from cachenode.front.admin import Admin
from cachenode.front.names import names_origin
from nezha.origins import OriginTable
from nezha.wire import (ADMIN_PATHS, HANDOFF_PATH, INTERNAL_PREFIX, INVALIDATE_PATH, PINS_PATH, PREFETCH_PATH,
                        REPLICAS_PATH, REPLICATE_PATH, STORED_PATH, TOKEN_HEADER)

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]
ANY = "*"  # a row's method: every method goes to its answer, which refuses what it does not take


@dataclass(frozen=True)
class Table:
    """path -> method (or ANY) -> answer."""

    admin: Mapping[str, Mapping[str, Answer]]
    internal: Mapping[str, Mapping[str, Answer]]

    def find(self, rows: Mapping[str, Mapping[str, Answer]], method: str, path: str) -> Answer | None:
        by_method = rows.get(path, {})
        return by_method.get(method) or by_method.get(ANY)


def route_table(*, admin: Admin, handoff: Handoff, invalidation: Invalidation, pinning: Pinning,
                intake: ReplicaIntake, stored: StoredChecks, prefetch: PrefetchFills) -> Table:
    return Table(
        admin={path: {ANY: admin.answer} for path in ADMIN_PATHS},
        internal={
            INVALIDATE_PATH: {ANY: invalidation.handle},  # 405 for another method, naming POST
            REPLICATE_PATH: {"POST": handoff.replicate_endpoint},
            REPLICAS_PATH: {"POST": intake.endpoint},  # small objects' replicas in batches
            HANDOFF_PATH: {"POST": handoff.handoff_endpoint, "GET": handoff.progress_endpoint},
            PINS_PATH: {ANY: pinning.endpoint},  # 405 for another method than GET and POST
            STORED_PATH: {"POST": stored.endpoint},
            PREFETCH_PATH: {"POST": prefetch.endpoint},  # the controller's fills, many in one request
        })


class Routes:
    """The node's own endpoints, on the data port and (admin alone) on the admin port."""

    def __init__(self, *, table: Table, origin_table: OriginTable, cluster_token: str | None) -> None:
        self.table = table
        self.origin_table = origin_table  # a Host that names one is an origin's request, never the node's
        self.cluster_token = cluster_token

    def endpoint(self, request: web.Request) -> Answer | None:
        """What answers `request` here, when it is for the node itself; None: a request for an origin."""
        if names_origin(self.origin_table, request.headers.get("Host")):
            return None
        raw_path = request.raw_path
        if raw_path in self.table.admin:
            return self.table.find(self.table.admin, request.method, raw_path)
        if raw_path.startswith(INTERNAL_PREFIX):
            return self._internal
        return None

    async def _internal(self, request: web.Request) -> web.StreamResponse:
        access(request).cache = "internal"
        why = refuse_internal(remote=request.remote, token=self.cluster_token,
                              presented=request.headers.get(TOKEN_HEADER))
        if why is not None:
            raise web.HTTPForbidden(text=f"{why}\n")
        path = request.raw_path.split("?", 1)[0]
        answer = self.table.find(self.table.internal, request.method, path)
        if answer is None:
            raise web.HTTPNotFound(text=f"no internal endpoint {request.method} {path}\n")
        return await answer(request)

    async def admin_port(self, request: web.Request) -> web.StreamResponse:
        """The admin port (`admin_listen`): the probes and metrics alone, to GET and HEAD."""
        answer = self.table.find(self.table.admin, request.method, request.raw_path)
        if request.method not in ("GET", "HEAD") or answer is None:
            raise web.HTTPNotFound(text=f"only {', '.join(sorted(ADMIN_PATHS))} answer on this port\n")
        return await answer(request)
