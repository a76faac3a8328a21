"""Pure: hold the pods of a workload that spreads its prefetch until the spread is done.

With `nezha.io/prefetch-spread: all` the controller copies a workload's
objects to every node (docs/controller.md), and that is worth most before
the pods read them. A pod's `spec.schedulingGates` holds it from the
scheduler (it stays Pending, `PodScheduled=False`, reason `SchedulingGated`);
kube-apiserver lets a gate be set only when the pod is created, by its
client or a mutating webhook, and afterwards only removed. So the webhook
puts the gate on at admission and the controller takes it off
(controller/gates.py) once the spread is done, or after
`--prefetch-gate-wait`. The names are nezha/prefetch/gate.py's.

A pod does not name its workload (a Deployment's pods are its ReplicaSet's),
so it takes two admissions:

- a Job, Deployment or StatefulSet created with `nezha.io/prefetch` and
  `nezha.io/prefetch-spread: all` gets `nezha.io/prefetch-for: KIND/NAME`
  in its pod template's annotations (metadata: nothing else changes);
- a pod created with that annotation gets the gate and the label
  `nezha.io/prefetch-gated: "true"`, which the controller watches by.

LeaderWorkerSets and JobSets, which the webhook is not sent, may carry the
annotation on their pod templates themselves. Like everything the webhook
does, this fails open: a pod admitted while the webhook is away is not held.
"""

from __future__ import annotations

from typing import Any

from nezha.prefetch import gate as names
from webhook.ops import Patch, at, escape

PREFETCH = "nezha.io/prefetch"
SPREAD = "nezha.io/prefetch-spread"
WORKLOADS = ("Job", "Deployment", "StatefulSet")


def hold(out: Patch, *, obj: dict[str, Any], kind: str, meta_path: str) -> None:
    """Add to `out` (built against `obj` already, its ops applied first) what holds `obj`'s pods."""
    if kind == "Pod":
        _gate_pod(out, obj)
    elif kind in WORKLOADS:
        _mark_template(out, obj, kind, meta_path)


def _mark_template(out: Patch, obj: dict[str, Any], kind: str, meta_path: str) -> None:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    if not annotations.get(PREFETCH) or str(annotations.get(SPREAD, "")).strip().lower() != "all":
        return
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        out.warnings.append(f"{SPREAD}: all on a {kind} created by generateName: its pods are not held until "
                            "the spread is done (their workload has no name yet)")
        return
    template = at(obj, meta_path + "/annotations")
    if isinstance(template, dict) and names.FOR in template:
        return  # a reinvocation, or the user's own
    _set(out, obj, meta_path, "annotations", names.FOR, f"{kind}/{name}")


def _gate_pod(out: Patch, obj: dict[str, Any]) -> None:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    if names.workload_of({"metadata": {**meta, "namespace": "-"}}) is None:
        return
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    gates = spec.get("schedulingGates")
    if names.gate_index(obj) is None:
        if isinstance(gates, list):
            out.ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": names.GATE}})
        else:
            out.ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": names.GATE}]})
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    if labels.get(names.GATED_LABEL) != "true":
        _set(out, obj, "/metadata", "labels", names.GATED_LABEL, "true")


def _set(out: Patch, obj: dict[str, Any], meta_path: str, field: str, key: str, value: str) -> None:
    """`meta_path`/`field`[`key`] = `value`, whether the map (or the metadata) exists in `obj`, was made by
    an earlier op of `out`, or neither."""
    map_path = f"{meta_path}/{field}"
    for op in out.ops:
        if op.get("op") == "add" and op.get("path") == map_path and isinstance(op.get("value"), dict):
            op["value"][key] = value
            return
        if op.get("op") == "add" and op.get("path") == meta_path and isinstance(op.get("value"), dict):
            op["value"].setdefault(field, {})[key] = value
            return
    if isinstance(at(obj, map_path), dict):
        out.ops.append({"op": "add", "path": f"{map_path}/{escape(key)}", "value": value})
    elif isinstance(at(obj, meta_path), dict):
        out.ops.append({"op": "add", "path": map_path, "value": {key: value}})
    else:
        out.ops.append({"op": "add", "path": meta_path, "value": {field: {key: value}}})
