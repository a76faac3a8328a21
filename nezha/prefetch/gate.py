"""The names by which a pod is held until its workload's prefetch is spread (`nezha.io/prefetch-spread: all`).

Pure: shared by the webhook, which puts the gate on a pod when it is
created (webhook/gate.py), and the controller, which takes it off
(controller/gates.py).

- `nezha.io/prefetch-for: KIND/NAME` on a pod (from its template): the
  workload in the pod's namespace whose spread the pod waits for;
- `spec.schedulingGates: [{name: nezha.io/prefetch}]`: the scheduling gate
  (kube-apiserver lets it be set only at creation, and only removed after);
- `nezha.io/prefetch-gated: "true"`: a label, so the controller watches
  the pods it may have to let go and no other.
"""

from __future__ import annotations

from typing import Any

GATE = "nezha.io/prefetch"
FOR = "nezha.io/prefetch-for"
GATED_LABEL = "nezha.io/prefetch-gated"
KINDS = ("Job", "Deployment", "StatefulSet", "LeaderWorkerSet", "JobSet")


def workload_of(pod: dict[str, Any]) -> str | None:
    """"KIND/NAMESPACE/NAME" of the workload `pod` waits for, as the controller names workloads; None
    when its annotation is absent or names no workload kind."""
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(FOR)
    if not isinstance(value, str):
        return None
    kind, _, name = value.strip().partition("/")
    if kind not in KINDS or not name or "/" in name:
        return None
    return f"{kind}/{meta.get('namespace')}/{name}"


def gate_index(pod: dict[str, Any]) -> int | None:
    """Where the gate is in the pod's `spec.schedulingGates`; None once it is gone (or never was)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for i, gate in enumerate(gates):
        if isinstance(gate, dict) and gate.get("name") == GATE:
            return i
    return None
