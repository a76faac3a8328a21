"""Pure core of the webhook: AdmissionReview v1 request -> response.

Two kinds of bad input are kept apart (as kopf's webhook server does):

- a malformed review (not a mapping, wrong apiVersion or kind, no request,
  uid or object) raises ReviewError; the server answers 400 with its message;
- a well-formed review whose object cannot be patched is *allowed*, unchanged,
  with a warning: the webhook fails open and never stops a job.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from nezha.errors import ReviewError
from webhook.ops import PatchError
from webhook.gate import hold
from webhook.patch import DEFAULT_NO_PROXY, POD_PATHS, patch_for
from webhook.rules import Rule
from webhook.sidecar import SidecarConfig

API_VERSION = "admission.k8s.io/v1"


@dataclass
class Decision:
    """The response to send plus what was done, for the request's log line."""

    response: dict[str, Any]
    uid: str
    kind: str
    namespace: str | None
    name: str | None
    ops: list[dict[str, Any]] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fallback: str | None = None  # why a sidecar asked for was not given (the pod is centralized)
    status: str | None = None  # the pod's nezha.io/status as patched


def parse_review(body: Any) -> dict[str, Any]:
    """The `request` of a well-formed AdmissionReview, or ReviewError naming what is wrong."""
    if not isinstance(body, dict):
        raise ReviewError(f"AdmissionReview must be a JSON object, got {type(body).__name__}")
    if body.get("apiVersion") != API_VERSION:
        raise ReviewError(f"apiVersion must be {API_VERSION}, got {_seen(body.get('apiVersion'))}")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind must be AdmissionReview, got {_seen(body.get('kind'))}")
    request = body.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing" if request is None else "request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(f"request.uid must be a non-empty string, got {_seen(uid)}")
    operation = request.get("operation", "CREATE")
    if operation in ("CREATE", "UPDATE", "CONNECT") and not isinstance(request.get("object"), dict):
        raise ReviewError("request.object is missing" if request.get("object") is None
                          else "request.object must be an object")
    return request


def review(body: Any, *, rules: tuple[Rule, ...] | list[Rule], cache_ip: str | None,
           proxy_url: str | None = None, no_proxy: str = DEFAULT_NO_PROXY,
           sidecar: SidecarConfig | None = None) -> Decision:
    """Answer one AdmissionReview. Raises ReviewError only for malformed input."""
    request = parse_review(body)
    uid = request["uid"]
    obj = request.get("object")
    # Only strings are taken from here on: these values are logged and put in
    # messages, and str() of an arbitrary (deep) value is neither short nor safe.
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    kind_ref = request.get("kind")
    kind = _text(kind_ref.get("kind") if isinstance(kind_ref, dict) else None) \
        or _text(obj.get("kind") if isinstance(obj, dict) else None)
    namespace = _text(request.get("namespace")) or _text(meta.get("namespace"))
    name = _text(request.get("name")) or _text(meta.get("name")) or _text(meta.get("generateName"))
    decision = Decision(response={"uid": uid, "allowed": True}, uid=uid, kind=str(kind), namespace=namespace,
                        name=name)
    # Pod specs are immutable after creation (hostAliases included), so only
    # a CREATE may be changed; anything else passes through.
    if request.get("operation", "CREATE") != "CREATE":
        return _wrap(decision)
    try:
        patch = patch_for(obj=obj, kind=str(kind), namespace=namespace, rules=rules, cache_ip=cache_ip,
                          proxy_url=proxy_url, no_proxy=no_proxy, sidecar=sidecar)
        # Held until its workload's prefetch is spread (webhook/gate.py): after the rules' ops, on the
        # object as they leave it; a kind patch_for refused above is not one that starts pods.
        hold(patch, obj=obj, kind=str(kind), meta_path=POD_PATHS[str(kind)][1])
    except PatchError as e:
        decision.warnings = [f"nezha: not patched: {e}"]
        decision.response["warnings"] = decision.warnings
        return _wrap(decision)
    decision.ops, decision.rules = patch.ops, patch.rules
    decision.fallback, decision.status = patch.fallback, patch.status
    decision.warnings = [f"nezha: {w}" for w in patch.warnings]
    if patch.ops:
        decision.response["patchType"] = "JSONPatch"
        decision.response["patch"] = base64.b64encode(
            json.dumps(patch.ops, separators=(",", ":")).encode()).decode("ascii")
    if decision.warnings:
        decision.response["warnings"] = decision.warnings
    return _wrap(decision)


def _seen(value: Any) -> str:
    """A value for an error message: scalars as they are (long strings cut), containers by type only."""
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:60] + "...")
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__


def _text(value: Any) -> str | None:
    """A non-empty string, or None for anything else."""
    return value if isinstance(value, str) and value else None


def _wrap(decision: Decision) -> Decision:
    decision.response = {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": decision.response}
    return decision
