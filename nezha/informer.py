"""One resource kept current: list, then watch from the list's resourceVersion.

An `Informer` holds the objects of one kind that match a selector, as the
API's own JSON (dicts), and calls `on_change()` after every change it
applies. It never polls: after the list, every change arrives on a watch
stream, and the stream is resumed from the last resourceVersion it saw
(bookmarks included, `allowWatchBookmarks`) whenever it ends: the server's
timeout, a dropped connection, or a connection that went silent past the
server's timeout plus a grace (a half-open one).

A `410 Gone` means the version is older than the API keeps history for, so
changes may have happened that no stream will replay: the informer lists
again and replaces what it holds with the list, so nothing that happened in
the gap is lost; the decision made from it is level-based anyway (from the
whole observed state, never from one event). kubernetes-asyncio's `Watch`
retries a 410 once with the same version and then raises it: that raise is
the relist signal.

The loop is deliberately small (it is hard to test an infinite loop): each
pass is `list` then `watch until it ends`, and any failure only decides how
long to wait before the next pass, and whether that pass lists first.

It is the one list+watch of the project: the controller holds its
StatefulSet, pods, Jobs, namespaces and ConfigMaps with it, and the
webhook's discovery (webhook/discovery.py) the cache Service. The base
package imports neither of them; what differs between users (their log
event names and context, whether a failure relists) is passed in.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp
import structlog
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

log = structlog.get_logger("nezha.informer")


@dataclass(frozen=True)
class Events:
    """The event names an informer logs under; a user whose names are documented or asserted keeps its own."""

    expired: str = "watch_expired"
    failed: str = "watch_failed"


class Informer:
    """Holds what `list_fn` returns for `kind`, kept current; see the module docstring.

    `relist_after_failure` lists again after every failed pass instead of
    resuming the watch from the last version where that is safe (a cut
    connection, a half-open one, a 429 or 5xx). Resuming is cheaper for a
    big kind; for one object a list costs no more than a watch request, and
    the webhook documents a relist after a dead connection.
    """

    def __init__(self, *, kind: str, list_fn: Callable[..., Awaitable[Any]], namespace: str | None,
                 on_change: Callable[[], None], label_selector: str | None = None,
                 field_selector: str | None = None, watch_timeout: int = 300, watch_grace: float = 15.0,
                 list_timeout: float = 30.0, backoff: tuple[float, float] = (0.2, 10.0),
                 relist_after_failure: bool = False, logger: Any = log, events: Events = Events()) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.namespace = namespace
        self.on_change = on_change
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.watch_grace = watch_grace
        self.list_timeout = list_timeout
        self.backoff = backoff
        self.relist_after_failure = relist_after_failure
        self._log = logger
        self._events = events
        # name -> object; "namespace/name" when watching every namespace (namespace None,
        # with a list_fn such as list_job_for_all_namespaces)
        self.objects: dict[str, dict] = {}
        self.synced = asyncio.Event()  # set after the first successful list
        self.version: str | None = None
        self.relists = 0
        self.events = 0

    def _args(self) -> tuple:
        return () if self.namespace is None else (self.namespace,)

    def _key(self, obj: dict) -> str:
        meta = obj["metadata"]
        return meta["name"] if self.namespace is not None else f"{meta.get('namespace')}/{meta['name']}"

    def _selectors(self) -> dict[str, str]:
        out = {}
        if self.label_selector:
            out["label_selector"] = self.label_selector
        if self.field_selector:
            out["field_selector"] = self.field_selector
        return out

    async def run(self) -> None:
        """Forever: list, then watch; a 410 relists at once, other failures after a backoff."""
        delay = self.backoff[0]
        while True:
            try:
                if self.version is None:
                    await self._list()
                await self._watch()
                delay = self.backoff[0]  # a stream that ended normally: resume at once
                continue
            except ApiException as e:
                if e.status == 410:
                    self._log.info(self._events.expired, kind=self.kind, version=self.version)
                    self.version = None
                    continue
                self._log.warning(self._events.failed, kind=self.kind, status=e.status, error=str(e.reason)[:300])
                if e.status not in (429,) and not 500 <= (e.status or 0) < 600:
                    self.version = None  # 403, 404...: start over from a list once it is fixed
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                self._log.warning(self._events.failed, kind=self.kind, error=f"{type(e).__name__}: {e}"[:300])
            except Exception as e:  # noqa: BLE001 - a cut or malformed line: never end the watch for good
                self._log.warning(self._events.failed, kind=self.kind, error=f"{type(e).__name__}: {e}"[:300])
                self.version = None  # what it held may have missed an event: list again
            if self.relist_after_failure:
                self.version = None
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.backoff[1])

    async def _list(self) -> None:
        response = await self.list_fn(*self._args(), _preload_content=False, _request_timeout=self.list_timeout,
                                       **self._selectors())
        try:
            listed = json.loads(await response.read())
        finally:
            response.release()
        self.relists += 1
        # List items come without kind and apiVersion (kube-apiserver leaves them out);
        # Events about them need both, so they are put back from the list's own.
        kind, api_version = (listed.get("kind") or "").removesuffix("List"), listed.get("apiVersion")
        for item in listed.get("items") or []:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", api_version)
        objects = {self._key(o): o for o in listed.get("items") or []}
        changed = objects != self.objects
        self.objects = objects
        self.version = listed["metadata"]["resourceVersion"]
        first = not self.synced.is_set()
        self.synced.set()
        if changed or first:
            self.on_change()

    async def _watch(self) -> None:
        """Apply events from `self.version` until the stream ends; raises on 410 and failures."""
        watch = Watch(return_type="object")  # raw dicts: no model objects to build per event
        try:
            async for event in watch.stream(self.list_fn, *self._args(), resource_version=self.version,
                                            allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout,
                                            _request_timeout=self.watch_timeout + self.watch_grace,
                                            **self._selectors()):
                kind, obj = event["type"], event["raw_object"]
                if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
                    raise ValueError(f"watch event without an object: {str(event)[:200]}")
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.version = version
                if kind == "BOOKMARK":
                    continue
                self.events += 1
                name = self._key(obj)
                if kind == "DELETED":
                    if self.objects.pop(name, None) is None:
                        continue
                elif self.objects.get(name) == obj:
                    continue
                else:
                    self.objects[name] = obj
                self.on_change()
        finally:
            await watch.close()
