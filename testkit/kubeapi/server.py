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
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import yaml
from aiohttp import web

from testkit.kubeapi.admission import Call, Refused, admit
from testkit.kubeapi import protobuf
from testkit.kubeapi.apply import Conflict, Owners, apply, conflict_message, record_write
from testkit.kubeapi.resources import (BY_PATH, RESOURCES, BadSelector, Resource, api_groups, api_resources, api_versions, matches,
                                     merge_patch, parse_label_selector)

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_WAKE = object()  # a watch's queue item that carries no event: look at the watch's state again
Key = tuple[str | None, str]  # (namespace, name)


def status(code: int, reason: str, message: str, *, details: dict | None = None) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return web.json_response(body, status=code)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def _manager(request: web.Request) -> str:
    """The field manager of a write: `fieldManager`, else the client's User-Agent name, as kube-apiserver does."""
    return request.query.get("fieldManager") or (request.headers.get("User-Agent") or "unknown").split("/")[0]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _go_value(value: Any) -> str:
    """A rejected value as kube-apiserver's field errors print it."""
    if isinstance(value, list):
        return "[]string{" + ", ".join(json.dumps(v) for v in value) + "}"
    return json.dumps(value)


def validate_webhook_configuration(res: Resource, obj: dict) -> None:
    """The checks of kube-apiserver's ValidateMutatingWebhookConfiguration that a manifest is likely to fail.

    In its order: per webhook, sideEffects and timeoutSeconds, then admissionReviewVersions.

    In admissionregistration.k8s.io/v1, sideEffects and admissionReviewVersions
    have no default: a webhook without them is refused, with every problem
    listed as kube-apiserver lists them.
    """
    causes: list[tuple[str, str, str]] = []  # (field, reason, message)
    for i, hook in enumerate(obj.get("webhooks") or []):
        at = f"webhooks[{i}]"
        side = hook.get("sideEffects")
        if side is None:
            causes.append((f"{at}.sideEffects", "FieldValueRequired",
                           "Required value: must specify one of None, NoneOnDryRun"))
        elif side not in ("None", "NoneOnDryRun"):
            causes.append((f"{at}.sideEffects", "FieldValueNotSupported",
                           f'Unsupported value: {json.dumps(side)}: supported values: "None", "NoneOnDryRun"'))
        timeout = hook.get("timeoutSeconds")
        if timeout is not None and not 1 <= timeout <= 30:
            causes.append((f"{at}.timeoutSeconds", "FieldValueInvalid",
                           f"Invalid value: {timeout}: the timeout value must be between 1 and 30 seconds"))
        versions = hook.get("admissionReviewVersions") or []
        if not versions:
            causes.append((f"{at}.admissionReviewVersions", "FieldValueRequired",
                           "Required value: must specify one of v1, v1beta1"))
        elif not set(versions) & {"v1", "v1beta1"}:
            causes.append((f"{at}.admissionReviewVersions", "FieldValueInvalid",
                           f"Invalid value: {_go_value(versions)}: must include at least one of v1, v1beta1"))
    if not causes:
        return
    errors = [f"{f}: {m}" for f, _, m in causes]
    name = (obj.get("metadata") or {}).get("name", "")
    raise ApiError(422, "Invalid", f'{res.kind}.{res.group} "{name}" is invalid: '
                   + (errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"),
                   {"name": name, "group": res.group, "kind": res.kind,
                    "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes]})


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


class KubeAPI:
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
                w.queue.put_nowait(_WAKE)
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
        backlog: list[tuple[str, dict]] = []
        too_old = False
        if rv_param in (None, "", "0"):
            backlog = [("ADDED", copy.deepcopy(o)) for o in self.objects_of(res.group, res.plural).values()
                       if watcher.wants(res, o)]
        else:
            try:
                since = int(rv_param)
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resource version {rv_param!r}") from None
            if since < self.compacted:
                too_old = True
            else:
                backlog = [(kind, o) for rv, r, kind, o in self.history if rv > since and watcher.wants(r, o)]
        # Registered before the first await, so no event falls between backlog and live stream.
        self.watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            if too_old:
                await self._send(response, "ERROR", {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": f"too old resource version: {rv_param} ({self.compacted})", "reason": "Expired",
                    "code": 410})
                return response
            for kind, obj in backlog:
                await self._send(response, kind, obj)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            while True:
                if watcher.stalled:
                    await self._hold(request, watcher)
                    break
                wait = self.bookmark_interval if bookmarks else None
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    wait = left if wait is None else min(wait, left)
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except asyncio.TimeoutError:
                    item = _WAKE
                if watcher.stalled:
                    continue
                if item is _WAKE:
                    if bookmarks and watcher.queue.empty():
                        await self._send(response, "BOOKMARK", {
                            "kind": res.kind, "apiVersion": res.api_version,
                            "metadata": {"resourceVersion": str(self.rv)}})
                    continue
                if item is None:
                    break
                await self._send(response, *item)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.discard(watcher)
        return response

    @staticmethod
    async def _hold(request: web.Request, watcher: Watcher) -> None:
        """Send nothing until the client goes away or the double ends the watch; swallow its events."""
        while True:
            try:
                if await asyncio.wait_for(watcher.queue.get(), 0.1) is None:
                    return
            except asyncio.TimeoutError:
                pass
            if request.transport is None or request.transport.is_closing():
                return

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: dict) -> None:
        await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    async def _body(self, request: web.Request) -> Any:
        ctype = request.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf":
            try:
                return protobuf.decode(await request.read())
            except protobuf.ProtobufError as e:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"{e}; send application/json") from e
        if ctype not in ("application/json", "application/merge-patch+json", "application/strategic-merge-patch+json",
                         "application/json-patch+json", "application/apply-patch+yaml"):
            # kube-apiserver's answer to a media type it does not serve; clients fall back to JSON on it.
            raise ApiError(415, "UnsupportedMediaType", f'the body of the request was in an unknown format - '
                           f'accepted media types include: application/json, application/yaml (got {ctype})')
        try:
            if ctype == "application/apply-patch+yaml":
                return yaml.safe_load(await request.read())
            return json.loads(await request.read())
        except (ValueError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ApiError(400, "BadRequest", f"the body of the request was in an unknown format: {e}") from e

    async def _create(self, request: web.Request, res: Resource, namespace: str | None) -> web.Response:
        return await self._create_obj(res, namespace, await self._body(request), manager=_manager(request))

    async def _create_obj(self, res: Resource, namespace: str | None, obj: Any, *, manager: str) -> web.Response:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        if obj.get("kind") not in (None, res.kind):
            raise ApiError(400, "BadRequest", f"the API version in the data ({obj.get('apiVersion')}) and kind "
                           f"({obj.get('kind')}) do not match the resource {res.plural}")
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                               "namespace sent on the request")
            if (None, namespace) not in self.objects_of("", "namespaces"):
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
            meta["namespace"] = namespace
        involved = (obj.get("involvedObject") or {}).get("namespace") if res.plural == "events" else None
        if involved not in (None, "", namespace):
            # kube-apiserver's Event validation: an Event lives beside what it is about.
            raise ApiError(422, "Invalid", f'Event "{meta.get("name") or meta.get("generateName")}" is invalid: '
                           f"involvedObject.namespace: Invalid value: {_go_value(involved)}: does not match "
                           f"event.namespace")
        if not meta.get("name") and not meta.get("generateName"):
            raise ApiError(422, "Invalid", f"{res.kind} \"\" is invalid: metadata.name: Required value: name or "
                           "generateName is required")
        if res.plural == "services":
            spec = obj.setdefault("spec", {})
            if not spec.get("clusterIP") and spec.get("type") != "ExternalName":
                spec["clusterIP"] = self._allocate_ip()
                spec["clusterIPs"] = [spec["clusterIP"]]
        warnings: list[str] = []
        try:
            obj, warnings = await admit(self, res=res, namespace=namespace, obj=obj)
        except Refused as e:
            raise ApiError(e.code, e.reason, e.message) from e
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = meta["generateName"] + "".join(random.choice(_NAME_CHARS) for _ in range(5))
        key = (namespace if res.namespaced else None, meta["name"])
        if key in self.objects_of(res.group, res.plural):
            raise ApiError(409, "AlreadyExists", f'{res.plural}{"." + res.group if res.group else ""} '
                           f'"{meta["name"]}" already exists', {"name": meta["name"], "kind": res.plural})
        if res.plural == "pods":
            obj.setdefault("status", {"phase": "Pending"})
            self._validate(obj)
        if res.plural == "mutatingwebhookconfigurations":
            validate_webhook_configuration(res, obj)
        obj = self._store_new(res, namespace, obj)
        self.field_owners[(res.group, res.plural, namespace, meta["name"])] = record_write({}, manager, None, obj)
        if res.plural == "jobs" and self.job_controller:
            task = asyncio.create_task(self._run_job(obj))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        response = web.json_response(obj, status=201)
        for w in warnings:
            response.headers.add("Warning", f'299 - "{w}"')
        return response

    def _validate(self, pod: dict) -> None:
        if not self.validate_pods:
            return
        import kubernetes_validate

        candidate = {k: v for k, v in pod.items() if k != "status"}
        try:
            kubernetes_validate.validate(candidate, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as e:
            first = str(e).splitlines()[0]
            raise ApiError(422, "Invalid", f'Pod "{pod["metadata"].get("name", "")}" is invalid: {first}') from e

    def _allocate_ip(self) -> str:
        used = {s.get("spec", {}).get("clusterIP") for s in self.objects_of("", "services").values()}
        while True:
            self._next_ip += 1
            ip = f"{self.service_network}.{self._next_ip // 250}.{self._next_ip % 250 + 1}"
            if ip not in used:
                return ip

    async def _run_job(self, job: dict) -> None:
        """What the Job controller does first: create the Job's pod from its template, through admission."""
        template = copy.deepcopy(job["spec"].get("template") or {})
        meta = template.setdefault("metadata", {})
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        meta["generateName"] = f"{name}-"
        meta.setdefault("labels", {}).update({"job-name": name, "batch.kubernetes.io/job-name": name,
                                              "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid})
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                    "controller": True, "blockOwnerDeletion": True}]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template.get("spec") or {}}
        res, namespace = BY_PATH[("", "v1", "pods")], job["metadata"]["namespace"]
        try:
            pod, _ = await admit(self, res=res, namespace=namespace, obj=pod,
                                 user="system:serviceaccount:kube-system:job-controller")
            pod["metadata"]["name"] = meta["generateName"] + "".join(random.choice(_NAME_CHARS) for _ in range(5))
            pod.setdefault("status", {"phase": "Pending"})
            self._validate(pod)
            self._store_new(res, namespace, pod)
        except (Refused, ApiError) as e:
            self.job_errors.append(f"job {namespace}/{name}: {e}")

    def _scale_of(self, res: Resource, obj: dict) -> dict:
        meta = obj["metadata"]
        selector = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                  "creationTimestamp") if k in meta},
                "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 1)},
                "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                           "selector": ",".join(f"{k}={v}" for k, v in selector.items())}}

    def _commit(self, res: Resource, namespace: str | None, name: str, old: dict, new: dict,
                sub: str | None, *, manager: str, owners: Owners | None = None) -> web.Response:
        """Store an update; `owners` is the field ownership an apply computed, else the writer takes what it changed."""
        if not isinstance(new, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        if sub == "scale":
            replicas = (new.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid '
                               f"value: {replicas!r}: must be greater than or equal to 0")
            updated = copy.deepcopy(old)
            updated.setdefault("spec", {})["replicas"] = replicas
        elif sub == "status":
            updated = copy.deepcopy(old)
            updated["status"] = new.get("status")
        else:
            updated = copy.deepcopy(new)
            updated["status"] = copy.deepcopy(old.get("status")) if "status" in old else new.get("status")
            if updated.get("status") is None:
                updated.pop("status", None)
        meta = updated.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the "
                           f"name on the URL ({name})")
        for k in ("uid", "creationTimestamp", "namespace", "generation"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
        meta["name"] = name
        updated["apiVersion"], updated["kind"] = res.api_version, res.kind
        if "generation" in meta and updated.get("spec") != old.get("spec"):
            meta["generation"] += 1
        if res.plural == "pods" and updated.get("spec") != old.get("spec"):
            self._pod_spec_update_allowed(old, updated)
        if res.plural == "mutatingwebhookconfigurations":
            validate_webhook_configuration(res, updated)
        key = (res.group, res.plural, namespace, name)
        self.field_owners[key] = owners if owners is not None else \
            record_write(self.field_owners.get(key, {}), manager, old, updated)
        if updated == old:
            return web.json_response(self._scale_of(res, old) if sub == "scale" else old)
        self._bump(updated)
        self.objects_of(res.group, res.plural)[(namespace, name)] = updated
        self._emit(res, "MODIFIED", updated)
        return web.json_response(self._scale_of(res, updated) if sub == "scale" else updated)

    @staticmethod
    def _pod_spec_update_allowed(old: dict, new: dict) -> None:
        def mutable_view(spec: dict) -> dict:
            spec = copy.deepcopy(spec)
            for c in spec.get("containers") or []:
                c.pop("image", None)
            spec.pop("activeDeadlineSeconds", None)
            spec.pop("tolerations", None)
            return spec

        if mutable_view(old.get("spec") or {}) != mutable_view(new.get("spec") or {}):
            raise ApiError(422, "Invalid", f'Pod "{old["metadata"]["name"]}" is invalid: spec: Forbidden: pod '
                           "updates may not change fields other than `spec.containers[*].image`, "
                           "`spec.activeDeadlineSeconds` or `spec.tolerations` (only additions to existing "
                           "tolerations)")

    async def _replace(self, request: web.Request, res: Resource, namespace: str | None, name: str,
                       sub: str | None) -> web.Response:
        old = self._get(res, namespace, name)
        new = await self._body(request)
        want = ((new or {}).get("metadata") or {}).get("resourceVersion") if isinstance(new, dict) else None
        if want and want != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.plural}'
                           f'{"." + res.group if res.group else ""} "{name}": the object has been modified; '
                           "please apply your changes to the latest version and try again",
                           {"name": name, "group": res.group, "kind": res.plural})
        return self._commit(res, namespace, name, old, new, sub, manager=_manager(request))

    async def _patch(self, request: web.Request, res: Resource, namespace: str | None, name: str,
                     sub: str | None) -> web.Response:
        ctype = request.content_type
        if ctype == "application/apply-patch+yaml":
            return await self._apply(request, res, namespace, name, sub)
        old = self._get(res, namespace, name)
        patch = await self._body(request)
        base = self._scale_of(res, old) if sub == "scale" else old
        try:
            if ctype == "application/json-patch+json":
                new = jsonpatch.apply_patch(base, patch)
            elif ctype == "application/merge-patch+json":
                new = merge_patch(base, patch)
            elif ctype == "application/strategic-merge-patch+json" and not res.custom:
                new = merge_patch(base, patch, strategic=True)
            else:
                raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                               "accepted media types include: application/json-patch+json, "
                               "application/merge-patch+json, application/strategic-merge-patch+json")
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {e}")
        want = (new.get("metadata") or {}).get("resourceVersion") if isinstance(new, dict) else None
        if want and want != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.plural} "{name}": the object '
                           "has been modified; please apply your changes to the latest version and try again")
        return self._commit(res, namespace, name, old, new, sub, manager=_manager(request))

    async def _apply(self, request: web.Request, res: Resource, namespace: str | None, name: str,
                     sub: str | None) -> web.Response:
        """Server-side apply (testkit/kubeapi/apply.py): create when missing, else merge with field ownership."""
        manager = request.query.get("fieldManager")
        if not manager:
            raise ApiError(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: "
                           "is required for apply patch")
        if sub is not None:
            raise ApiError(415, "UnsupportedMediaType", "the double applies only to whole objects")
        config = await self._body(request)
        if not isinstance(config, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        if (config.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        old = self.objects_of(res.group, res.plural).get((namespace if res.namespaced else None, name))
        if old is None:
            config.setdefault("metadata", {})["name"] = name
            response = await self._create_obj(res, namespace, copy.deepcopy(config), manager=manager)
            response.set_status(201)
            return response
        key = (res.group, res.plural, namespace if res.namespaced else None, name)
        try:
            new, owners = apply(old, config, self.field_owners.get(key, {}), manager,
                                force=request.query.get("force", "").lower() == "true")
        except Conflict as e:
            raise ApiError(409, "Conflict", conflict_message(res.kind, res.api_version, e.conflicts),
                           {"name": name, "group": res.group, "kind": res.plural,
                            "causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"',
                                        "field": "." + ".".join(p)} for m, p in e.conflicts]}) from e
        return self._commit(res, namespace if res.namespaced else None, name, old, new, None,
                            manager=manager, owners=owners)

    async def _delete_request(self, request: web.Request, res: Resource, namespace: str | None,
                              name: str) -> web.Response:
        """DELETE, with a pod's graceful deletion as kube-apiserver does it.

        A pod bound to a node (`spec.nodeName`) is not removed at once: it
        gets `deletionTimestamp` (now + the grace period) and
        `deletionGracePeriodSeconds`, a MODIFIED event, and stays until a
        DELETE with `gracePeriodSeconds=0` (what the kubelet sends once the
        containers are gone). The grace period comes from the request
        (`gracePeriodSeconds`, query or DeleteOptions body), else the pod's
        `terminationGracePeriodSeconds`, else 30. An unbound pod, and every
        other kind, goes at once.
        """
        obj = self._get(res, namespace, name)
        grace: int | None = None
        if "gracePeriodSeconds" in request.query:
            grace = int(request.query["gracePeriodSeconds"])
        elif request.can_read_body:
            body = await self._body(request)
            if isinstance(body, dict) and isinstance(body.get("gracePeriodSeconds"), int):
                grace = body["gracePeriodSeconds"]
        if res.plural != "pods" or not (obj.get("spec") or {}).get("nodeName"):
            return self._delete(res, namespace, name)
        if grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        if grace <= 0:
            return self._delete(res, namespace, name)
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return web.json_response(obj)  # already terminating: a longer grace never extends it
        meta["deletionTimestamp"] = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=grace)).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        meta["deletionGracePeriodSeconds"] = grace
        self._bump(obj)
        self._emit(res, "MODIFIED", obj)
        return web.json_response(obj)

    def _delete(self, res: Resource, namespace: str | None, name: str) -> web.Response:
        obj = self._get(res, namespace, name)
        del self.objects_of(res.group, res.plural)[(namespace, name)]
        self.field_owners.pop((res.group, res.plural, namespace, name), None)
        obj = copy.deepcopy(obj)
        self._bump(obj)
        self._emit(res, "DELETED", obj)
        return web.json_response(obj)
