"""The watch side of the Kubernetes API double (testkit/kubeapi/server.py):
lists and watch streams over label and field selectors, a watch's backlog
(every object, or the history after a resourceVersion, or 410 Gone when
compacted), BOOKMARK events, timeoutSeconds, and a stalled watch.

A mixin of `KubeAPI`: it needs `objects_of`, `rv`, `history`, `compacted`,
`watchers`, `watch_ends` and `bookmark_interval` of the class it is mixed into.
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field

from aiohttp import web

from testkit.kubeapi.resources import BadSelector, Resource, matches, parse_label_selector
from testkit.kubeapi.status import ApiError

WAKE = object()  # a watch's queue item that carries no event: look at the watch's state again


@dataclass(eq=False)
class Watcher:
    res: Resource
    namespace: str | None
    terms: list
    fields: dict[str, str]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    request: web.Request | None = None
    stalled: bool = False

    def wants(self, res: Resource, obj: dict) -> bool:
        meta = obj.get("metadata") or {}
        if res.key != self.res.key or (self.namespace is not None and meta.get("namespace") != self.namespace):
            return False
        for k, v in self.fields.items():
            if k == "metadata.name" and meta.get("name") != v or k == "metadata.namespace" and \
                    meta.get("namespace") != v:
                return False
        return matches(self.terms, meta.get("labels"))


class Watches:
    """Lists and watches of the API double (see the module's docstring for what it needs)."""

    def _selection(self, request: web.Request, res: Resource, namespace: str | None) -> Watcher:
        try:
            terms = parse_label_selector(request.query.get("labelSelector"))
        except BadSelector as e:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {e}") from e
        fields = {}
        for part in filter(None, (request.query.get("fieldSelector") or "").split(",")):
            k, _, v = part.replace("==", "=").partition("=")
            if k not in ("metadata.name", "metadata.namespace"):
                raise ApiError(400, "BadRequest", f'field label not supported: {k}')
            fields[k] = v
        return Watcher(res=res, namespace=namespace, terms=terms, fields=fields)

    def _list(self, request: web.Request, res: Resource, namespace: str | None) -> web.Response:
        sel = self._selection(request, res, namespace)
        items = [copy.deepcopy(o) for o in self.objects_of(res.group, res.plural).values() if sel.wants(res, o)]
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        for item in items:  # list items carry no apiVersion/kind, as from kube-apiserver
            item.pop("apiVersion", None), item.pop("kind", None)
        return web.json_response({"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                  "metadata": {"resourceVersion": str(self.rv)}, "items": items})

    async def _watch(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        watcher = self._selection(request, res, namespace)
        watcher.request = request
        rv_param = request.query.get("resourceVersion")
        bookmarks = (request.query.get("allowWatchBookmarks") or "").lower() in ("true", "1")
        timeout = float(request.query.get("timeoutSeconds") or 0) or None
        backlog, too_old = self._backlog(watcher, res, rv_param)
        # Registered before the first await, so no event falls between backlog and live stream.
        self.watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        ended = "cut"  # by the client going away, or a connection error
        try:
            await response.prepare(request)
            if too_old:
                await self._send(response, "ERROR", {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": f"too old resource version: {rv_param} ({self.compacted})", "reason": "Expired",
                    "code": 410})
                ended = "expired"
                return response
            for kind, obj in backlog:
                await self._send(response, kind, obj)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            while True:
                if watcher.stalled:
                    ended = await self._hold(request, watcher)
                    break
                wait = self.bookmark_interval if bookmarks else None
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        ended = "timeoutSeconds"
                        break
                    wait = left if wait is None else min(wait, left)
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except asyncio.TimeoutError:
                    item = WAKE
                if watcher.stalled:
                    continue
                if item is WAKE:
                    if bookmarks and watcher.queue.empty():
                        await self._send(response, "BOOKMARK", {
                            "kind": res.kind, "apiVersion": res.api_version,
                            "metadata": {"resourceVersion": str(self.rv)}})
                    continue
                if item is None:
                    ended = "dropped"
                    break
                await self._send(response, *item)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.discard(watcher)
            self.watch_ends.append(ended)
        return response

    def _backlog(self, watcher: Watcher, res: Resource, rv_param: str | None) -> tuple[list[tuple[str, dict]], bool]:
        """The events a new watch starts with: every object as ADDED without a
        resourceVersion, else the history after it; True when that history
        was compacted (410 Gone)."""
        if rv_param in (None, "", "0"):
            return [("ADDED", copy.deepcopy(o)) for o in self.objects_of(res.group, res.plural).values()
                    if watcher.wants(res, o)], False
        try:
            since = int(rv_param)
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resource version {rv_param!r}") from None
        if since < self.compacted:
            return [], True
        return [(kind, o) for rv, r, kind, o in self.history if rv > since and watcher.wants(r, o)], False

    @staticmethod
    async def _hold(request: web.Request, watcher: Watcher) -> str:
        """Send nothing until the client goes away ("client gone") or the double
        ends the watch ("dropped"); swallow its events."""
        while True:
            try:
                if await asyncio.wait_for(watcher.queue.get(), 0.1) is None:
                    return "dropped"
            except asyncio.TimeoutError:
                pass
            if request.transport is None or request.transport.is_closing():
                return "client gone"

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: dict) -> None:
        await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
