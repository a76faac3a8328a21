"""The write side of the Kubernetes API double (testkit/kubeapi/server.py):
request bodies (JSON, YAML apply, protobuf), create with admission,
ClusterIP allocation and Job pods, PUT with optimistic concurrency, JSON
merge, strategic merge and JSON patch, server-side apply, and deletes
(bound pods gracefully). Validation of webhook configurations as
kube-apiserver does it.

A mixin of `KubeAPI`: it uses the store and events of the class it is
mixed into (`_get`, `_store_new`, `_emit`, `_bump`, `objects_of`...).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import random
from typing import Any

import jsonpatch
import yaml
from aiohttp import web

from testkit.kubeapi.admission import Refused, admit
from testkit.kubeapi import protobuf
from testkit.kubeapi.apply import Conflict, Owners, apply, conflict_message, record_write
from testkit.kubeapi.resources import BY_PATH, Resource, merge_patch
from testkit.kubeapi.status import ApiError, status

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def pending(pod: dict) -> dict:
    """A new pod's status: Pending, and, with a scheduling gate, `PodScheduled=False` for the reason, as
    kube-apiserver sets it at creation (the scheduler does not look at a gated pod, so nothing else does)."""
    if not (pod.get("spec") or {}).get("schedulingGates"):
        return {"phase": "Pending"}
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                                "message": "Scheduling is blocked due to non-empty scheduling gates",
                                                "lastProbeTime": None, "lastTransitionTime":
                                                dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}]}


def _manager(request: web.Request) -> str:
    """The field manager of a write: `fieldManager`, else the client's User-Agent name, as kube-apiserver does."""
    return request.query.get("fieldManager") or (request.headers.get("User-Agent") or "unknown").split("/")[0]


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


class Writes:
    """Creates, updates, patches and deletes of the API double."""

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
            obj.setdefault("status", pending(obj))
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
            pod.setdefault("status", pending(pod))
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
        # kube-apiserver's validateOnlyDeletedSchedulingGates: a gate may be set only at creation,
        # then only removed (any of them, in any order).
        had = [g.get("name") for g in (old.get("spec") or {}).get("schedulingGates") or []]
        for i, gate in enumerate((new.get("spec") or {}).get("schedulingGates") or []):
            if gate.get("name") not in had:
                raise ApiError(422, "Invalid", f'Pod "{old["metadata"]["name"]}" is invalid: '
                               f"spec.schedulingGates[{i}].name: Forbidden: only deletion is allowed, but found "
                               f"new scheduling gate '{gate.get('name')}'")

        def mutable_view(spec: dict) -> dict:
            spec = copy.deepcopy(spec)
            for c in spec.get("containers") or []:
                c.pop("image", None)
            spec.pop("activeDeadlineSeconds", None)
            spec.pop("tolerations", None)
            spec.pop("schedulingGates", None)
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
