"""What kube-apiserver's MutatingAdmissionWebhook plugin does on a write, for the double.

For each webhook of each MutatingWebhookConfiguration (configurations by
name, webhooks in order): match rules, namespaceSelector and objectSelector;
send an AdmissionReview v1 over HTTPS, verifying the server against
`caBundle`; apply the returned JSONPatch; honour `failurePolicy` (default
Fail) and `timeoutSeconds` (default 10); reinvoke `IfNeeded` webhooks once
when a later webhook changed the object. Denials and failures come back as
the Status objects kube-apiserver returns.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import jsonpatch
from yarl import URL

from testkit.kubeapi.resources import BadSelector, Resource, matches, selector_terms

if TYPE_CHECKING:
    from testkit.kubeapi.server import KubeAPI


class Refused(Exception):
    """The write is refused with this Status (code, reason, message)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class Call:
    """One webhook call, as the double saw it (tests assert on these)."""

    webhook: str
    outcome: str  # patched | unchanged | denied | failed-open | failed-closed
    error: str | None = None
    review: dict[str, Any] = field(default_factory=dict)
    deadline: float = 10.0  # the timeoutSeconds the call was given: the one timer on it


def rule_matches(rule: dict[str, Any], res: Resource, operation: str) -> bool:
    def has(values: list[str] | None, value: str) -> bool:
        return bool(values) and ("*" in values or value in values)

    scope = rule.get("scope", "*")
    if scope == "Namespaced" and not res.namespaced or scope == "Cluster" and res.namespaced:
        return False
    return (has(rule.get("operations"), operation) and has(rule.get("apiGroups"), res.group)
            and has(rule.get("apiVersions"), res.version) and has(rule.get("resources"), res.plural))


def _selected(api: "KubeAPI", hook: dict[str, Any], res: Resource, namespace: str | None, obj: dict) -> bool:
    if not any(rule_matches(r, res, "CREATE") for r in hook.get("rules") or []):
        return False
    if res.namespaced:
        ns_obj = api.objects_of("", "namespaces").get((None, namespace)) or {}
        ns_labels = (ns_obj.get("metadata") or {}).get("labels") or {}
    else:
        ns_labels = (obj.get("metadata") or {}).get("labels") or {}
    try:
        return (matches(selector_terms(hook.get("namespaceSelector")), ns_labels)
                and matches(selector_terms(hook.get("objectSelector")), (obj.get("metadata") or {}).get("labels")))
    except BadSelector:
        return False


def _endpoint(api: "KubeAPI", config: dict[str, Any]) -> tuple[str, str | None]:
    """URL to POST to, and the TLS server name to verify when it differs from the URL's host."""
    if config.get("url"):
        return config["url"], None
    svc = config.get("service") or {}
    name, ns, port = svc.get("name"), svc.get("namespace"), svc.get("port", 443)
    address = api.service_addresses.get((ns, name, port))
    if address is None:
        raise ConnectionError(f'service "{name}" not found in namespace "{ns}" (no address registered)')
    return f"https://{address}{svc.get('path') or '/'}", f"{name}.{ns}.svc"


async def _call(api: "KubeAPI", hook: dict[str, Any], review: dict[str, Any], *, deadline: float) -> dict[str, Any]:
    config = hook.get("clientConfig") or {}
    url, server_name = _endpoint(api, config)
    if URL(url).scheme != "https":
        raise ConnectionError(f"webhook URL {url} is not https")
    ctx = ssl.create_default_context()
    if config.get("caBundle"):
        ctx = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
    timeout = aiohttp.ClientTimeout(total=deadline)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(url, json=review, ssl=ctx, server_hostname=server_name) as r:
            text = await r.text()
            if r.status != 200:
                raise ConnectionError(f"the server responded with the status code {r.status} but did not "
                                      f"return a valid AdmissionReview: {text.strip()[:200]}")
            try:
                return json.loads(text)
            except ValueError as e:
                raise ConnectionError(f"response is not JSON: {e}") from e


def _parse_response(body: Any, uid: str) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("apiVersion") != "admission.k8s.io/v1" \
            or body.get("kind") != "AdmissionReview":
        raise ValueError("expected response.apiVersion admission.k8s.io/v1 and kind AdmissionReview")
    resp = body.get("response")
    if not isinstance(resp, dict):
        raise ValueError("webhook response was absent")
    if resp.get("uid") != uid:
        raise ValueError(f"expected response.uid={uid!r}, got {resp.get('uid')!r}")
    if not isinstance(resp.get("allowed"), bool):
        raise ValueError("response.allowed is missing")
    return resp


async def admit(api: "KubeAPI", *, res: Resource, namespace: str | None, obj: dict[str, Any],
                user: str = "kubernetes-admin") -> tuple[dict[str, Any], list[str]]:
    """Run the mutating webhooks on a CREATE; returns the object to store and the warnings."""
    configs = sorted(api.objects_of("admissionregistration.k8s.io", "mutatingwebhookconfigurations").values(),
                     key=lambda c: c["metadata"]["name"])
    hooks = [h for c in configs for h in c.get("webhooks") or []]
    warnings: list[str] = []
    calls: dict[int, int] = {}
    obj = copy.deepcopy(obj)
    order = list(range(len(hooks)))
    # One reinvocation round for IfNeeded webhooks called before a later change.
    position = 0
    while position < len(order):
        i = order[position]
        position += 1
        hook = hooks[i]
        if not _selected(api, hook, res, namespace, obj):
            continue
        calls[i] = calls.get(i, 0) + 1
        obj, changed = await _call_one(api, hook, _review(res, namespace, obj, user), name=hook.get("name", f"#{i}"),
                                       obj=obj, warnings=warnings)
        if changed:
            for j in range(len(hooks)):
                if j < i and calls.get(j) == 1 and hooks[j].get("reinvocationPolicy") == "IfNeeded" \
                        and j not in order[position:]:
                    order.append(j)
    return obj, warnings


def _review(res: Resource, namespace: str | None, obj: dict[str, Any], user: str) -> dict[str, Any]:
    """The AdmissionReview v1 kube-apiserver sends for a CREATE of `obj`, with a fresh uid."""
    group_version = {"group": res.group, "version": res.version}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {**group_version, "kind": res.kind},
        "resource": {**group_version, "resource": res.plural},
        "requestKind": {**group_version, "kind": res.kind},
        "requestResource": {**group_version, "resource": res.plural},
        "name": (obj.get("metadata") or {}).get("name", ""), "namespace": namespace or "",
        "operation": "CREATE", "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


async def _call_one(api: "KubeAPI", hook: dict[str, Any], review: dict[str, Any], *, name: str,
                    obj: dict[str, Any], warnings: list[str]) -> tuple[dict[str, Any], bool]:
    """Send `review` to one webhook and apply its answer: the object after its
    patch, and whether the patch changed it. Its warnings are added to
    `warnings`; a denial, or a failure under failurePolicy Fail, raises Refused."""
    deadline = hook.get("timeoutSeconds", 10)
    try:
        resp = _parse_response(await _call(api, hook, review, deadline=deadline), review["request"]["uid"])
        if not resp["allowed"]:
            status = resp.get("status") or {}
            api.admission_calls.append(Call(name, "denied", review=review, deadline=deadline))
            raise Refused(status.get("code") or 403, status.get("reason") or "Forbidden",
                          f'admission webhook "{name}" denied the request: '
                          f'{status.get("message") or "without explanation"}')
        warnings += [w for w in resp.get("warnings") or [] if isinstance(w, str)]
        changed = False
        if resp.get("patch") is not None:
            if resp.get("patchType") != "JSONPatch":
                raise ValueError(f"unsupported patch type {resp.get('patchType')!r}")
            ops = json.loads(base64.b64decode(resp["patch"]))
            new = jsonpatch.apply_patch(obj, ops)
            changed = new != obj
            obj = new
        api.admission_calls.append(Call(name, "patched" if changed else "unchanged", review=review,
                                        deadline=deadline))
        return obj, changed
    except Refused:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, ssl.SSLError, ValueError,
            jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        reason = "context deadline exceeded" if isinstance(e, asyncio.TimeoutError) else \
            (str(e) or type(e).__name__)
        if hook.get("failurePolicy", "Fail") == "Ignore":
            api.admission_calls.append(Call(name, "failed-open", error=reason, review=review, deadline=deadline))
            return obj, False
        api.admission_calls.append(Call(name, "failed-closed", error=reason, review=review, deadline=deadline))
        raise Refused(500, "InternalError",
                      f'Internal error occurred: failed calling webhook "{name}": {reason}') from e
