"""The Kubernetes API double: an aiohttp app over an in-memory store.

Honest to kube-apiserver where Nezha depends on it: paths, list and object
shapes, string resourceVersions from one cluster-wide counter, Status objects
for 400/404/409/410/422/500, optimistic concurrency on PUT, watch streams
(initial ADDED events without a resourceVersion, replay from one, BOOKMARK
events with `allowWatchBookmarks`, `410 Gone` as an ERROR event for a
compacted version, `timeoutSeconds`), JSON merge, strategic merge (lists
merged by `name`) and JSON patch, the `scale` and `status` subresources, the
namespace label `kubernetes.io/metadata.name`, Service ClusterIP allocation,
mutating admission webhooks on create (admission.py), and a Job controller
that creates a Job's pod through that same admission path.

Pods bound to a node are deleted gracefully (deletionTimestamp first, gone
after a DELETE with gracePeriodSeconds=0, as the kubelet sends).
Simpler than kube-apiserver: no authentication, no defaulting beyond the
above, no field managers or server-side apply, no finalizers, no garbage
collection, no kubelet (the grace period is not enforced by the double).

History is kept for the last `history_limit` events, like etcd between
compactions: a watch from a version older than the oldest event kept gets
410 Gone, never a replay with a gap. MutatingWebhookConfigurations are
validated as kube-apiserver validates them (sideEffects and
admissionReviewVersions required, timeoutSeconds 1 to 30), with 422 Invalid.

Test-side controls: `compact()` (later watches from older versions get 410),
`drop_watches()` (end or cut every open watch), `stall_watches()` (open
watches go silent, as over a half-open connection), `service_addresses`
(where a webhook Service is reachable), `admission_calls` (what the webhooks
were asked and answered), `requests` (method and path of every API request).

This module holds the store, its events and the routes; lists and watches
are in watches.py, writes in writes.py, Status answers in status.py.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import uuid

from aiohttp import web

from testkit.kubeapi.admission import Call
from testkit.kubeapi.apply import Owners, apply
from testkit.kubeapi.resources import BY_PATH, RESOURCES, Resource, api_groups, api_resources, api_versions
from testkit.kubeapi.status import ApiError, status
from testkit.kubeapi.watches import WAKE, Watcher, Watches
from testkit.kubeapi.writes import Writes

Key = tuple[str | None, str]  # (namespace, name)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeAPI(Watches, Writes):
    def __init__(self, *, bookmark_interval: float = 0.5, validate_pods: bool = True,
                 job_controller: bool = True, history_limit: int = 5000) -> None:
        self.bookmark_interval = bookmark_interval
        self.history_limit = history_limit
        self.validate_pods = validate_pods
        self.job_controller = job_controller
        self.rv = 1
        self.compacted = 0
        self.store: dict[tuple[str, str], dict[Key, dict]] = {}
        self.history: list[tuple[int, Resource, str, dict]] = []
        self.watchers: set[Watcher] = set()
        # Why each watch ended, in order: timeoutSeconds, dropped (drop_watches, or stop), expired (410),
        # client gone (a stalled watch's client gave up), cut (its connection failed).
        self.watch_ends: list[str] = []
        self.service_addresses: dict[tuple[str, str, int], str] = {}
        # Who set which fields (server-side apply), by (group, plural, namespace, name).
        self.field_owners: dict[tuple[str, str, str | None, str], Owners] = {}
        self.admission_calls: list[Call] = []
        self.requests: list[tuple[str, str]] = []
        self.job_errors: list[str] = []
        self._next_ip = 10
        # What GET /version says (major, minor): tests of version-dependent behaviour set an older one.
        self.version = ("1", "35")
        # The first two octets of ClusterIPs (kube-apiserver's --service-cluster-ip-range); the
        # whole-system test makes them loopback addresses, where its kube-proxy stand-in listens.
        self.service_network = "10.96"
        # What it serves: the built-in kinds, and custom ones once install_crd is called.
        self.resources: list[Resource] = list(RESOURCES)
        self.by_path: dict[tuple[str, str, str], Resource] = dict(BY_PATH)
        self._tasks: set[asyncio.Task] = set()
        self.runner: web.AppRunner | None = None
        self.url = ""
        for ns in ("default", "kube-system"):
            self._store_new(BY_PATH[("", "v1", "namespaces")], None, {"metadata": {"name": ns}})

    # -- lifecycle ---------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        async def version(request: web.Request) -> web.Response:
            major, minor = self.version
            git = f"v{major}.{minor.rstrip('+')}.0-nezha-double"
            return web.json_response({"major": major, "minor": minor, "gitVersion": git,
                                      "gitCommit": "0" * 40, "gitTreeState": "clean",
                                      "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0",
                                      "compiler": "gc", "platform": "linux/amd64"})

        async def core_versions(request: web.Request) -> web.Response:
            return web.json_response(api_versions())

        async def groups(request: web.Request) -> web.Response:
            return web.json_response(api_groups(self.resources))

        async def resources(request: web.Request) -> web.Response:
            listed = api_resources(request.match_info.get("group", ""), request.match_info["version"],
                                   self.resources)
            if listed is None:
                return status(404, "NotFound", "the server could not find the requested resource")
            return web.json_response(listed)

        app.router.add_get("/version", version)
        app.router.add_get("/version/", version)  # kubernetes-asyncio's VersionApi asks with the slash
        # Discovery, so kubectl can map kinds to resources.
        for slash in ("", "/"):  # kube-apiserver answers both spellings; clients use both
            app.router.add_get("/api" + slash, core_versions)
            app.router.add_get("/apis" + slash, groups)
            app.router.add_get("/api/{version}" + slash, resources)
            app.router.add_get("/apis/{group}/{version}" + slash, resources)
        app.router.add_route("*", "/api/{version}/{tail:.*}", self._dispatch)
        app.router.add_route("*", "/apis/{group}/{version}/{tail:.*}", self._dispatch)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self.runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches(abrupt=False)
        for t in list(self._tasks):
            t.cancel()
        if self.runner is not None:
            await self.runner.cleanup()

    def client(self):
        """A kubernetes_asyncio ApiClient pointed at this double."""
        from kubernetes_asyncio.client import ApiClient, Configuration

        return ApiClient(configuration=Configuration(host=self.url))

    # -- test-side controls --------------------------------------------------

    def install_crd(self, resource: Resource) -> None:
        """Serve `resource` from now on, as a cluster does once its CustomResourceDefinition is
        established: in discovery (`/apis`, `/apis/GROUP/VERSION`) and at its paths. Before, both
        answer as kube-apiserver does for a group it does not know: absent, and 404."""
        if resource.key not in {r.key for r in self.resources}:
            self.resources.append(resource)
            self.by_path[(resource.group, resource.version, resource.plural)] = resource

    def compact(self) -> int:
        """Forget history: a watch from any version handed out so far now gets 410 Gone.

        The counter moves on first, so a fresh list's version is not itself expired.
        """
        self.rv += 1
        self.compacted = self.rv
        self.history.clear()
        return self.compacted

    def drop_watches(self, *, abrupt: bool = True) -> int:
        """End every open watch: cut the connection (abrupt) or finish the stream cleanly."""
        n = 0
        for w in list(self.watchers):
            if abrupt and w.request is not None and w.request.transport is not None:
                w.request.transport.abort()
            w.queue.put_nowait(None)
            n += 1
        return n

    def stall_watches(self) -> int:
        """Open watches go silent and stay open: no events, bookmarks or end, whatever their timeoutSeconds.

        What a client sees on a half-open connection. The events they would
        have carried are lost; the watch ends only when the client gives up
        (or `stop()` / `drop_watches()`). Watches opened later are normal.
        """
        n = 0
        for w in list(self.watchers):
            if not w.stalled:
                w.stalled = True
                w.queue.put_nowait(WAKE)
                n += 1
        return n

    def objects_of(self, group: str, plural: str) -> dict[Key, dict]:
        return self.store.setdefault((group, plural), {})

    # -- storage -----------------------------------------------------------

    def _emit(self, res: Resource, kind: str, obj: dict) -> None:
        snapshot = copy.deepcopy(obj)
        self.history.append((self.rv, res, kind, snapshot))
        if len(self.history) > self.history_limit:
            # A watch from before the newest dropped event would miss that
            # event: it gets 410 Gone instead, as after an etcd compaction.
            self.compacted = max(self.compacted, self.history[-self.history_limit - 1][0])
            del self.history[:-self.history_limit]
        for w in list(self.watchers):
            if w.wants(res, snapshot):
                w.queue.put_nowait((kind, snapshot))

    def _bump(self, obj: dict) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _store_new(self, res: Resource, namespace: str | None, obj: dict) -> dict:
        meta = obj.setdefault("metadata", {})
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        if res.namespaced:
            meta["namespace"] = namespace
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["creationTimestamp"] = _now()
        if res.plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("status", {"phase": "Active"})
        if res.scale or res.plural == "jobs":
            meta["generation"] = 1
        self._bump(obj)
        self.objects_of(res.group, res.plural)[(namespace if res.namespaced else None, meta["name"])] = obj
        self._emit(res, "ADDED", obj)
        return obj

    # -- HTTP --------------------------------------------------------------

    def _resolve(self, request: web.Request) -> tuple[Resource, str | None, str | None, str | None]:
        group = request.match_info.get("group", "")
        version = request.match_info["version"]
        parts = [p for p in request.match_info["tail"].split("/") if p]
        namespace = None
        if len(parts) >= 3 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        if not parts or len(parts) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        res = self.by_path.get((group, version, parts[0]))
        if res is None or (namespace is not None and not res.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        if sub is not None and not (sub == "status" or sub == "scale" and res.scale):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if name is not None and res.namespaced and namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res, namespace, name, sub

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        try:
            res, namespace, name, sub = self._resolve(request)
            method = request.method
            if name is None:
                if method == "GET":
                    if (request.query.get("watch") or "").lower() in ("true", "1"):
                        return await self._watch(request, res, namespace)
                    return self._list(request, res, namespace)
                if method == "POST" and (namespace is not None or not res.namespaced):
                    return await self._create(request, res, namespace)
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on this collection")
            if method == "GET":
                obj = self._get(res, namespace, name)
                return web.json_response(self._scale_of(res, obj) if sub == "scale" else obj)
            if method == "PUT":
                return await self._replace(request, res, namespace, name, sub)
            if method == "PATCH":
                return await self._patch(request, res, namespace, name, sub)
            if method == "DELETE" and sub is None:
                return await self._delete_request(request, res, namespace, name)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")
        except ApiError as e:
            return status(e.code, e.reason, e.message, details=e.details)

    def _get(self, res: Resource, namespace: str | None, name: str) -> dict:
        obj = self.objects_of(res.group, res.plural).get((namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{res.plural}{"." + res.group if res.group else ""} "{name}" not found',
                           {"name": name, "group": res.group, "kind": res.plural})
        return obj

