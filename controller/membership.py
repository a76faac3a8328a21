"""Ring membership from what the API says about the cache pods. Pure: no I/O.

The ring holds exactly the cache pods that can serve: Ready and not being
deleted. Objects are plain dicts in the API's own JSON shape (camelCase, as
`ApiClient.sanitize_for_serialization` gives them), so the decision is
tested on literal objects without a client.

A node's identity is its pod name (`nezha-cache-0`): stable across
restarts, so a pod that comes back owns the same keys and finds its disk's
objects still its own. Its address is what peers dial: the pod's DNS name
under the StatefulSet's headless Service, or its IP.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

Obj = Mapping[str, Any]


def _get(obj: Obj | None, *path: str, default: Any = None) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return default
        obj = obj.get(part)
    return default if obj is None else obj


def is_member(pod: Obj) -> bool:
    """Ready (its Ready condition True) and not being deleted."""
    if _get(pod, "metadata", "deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in _get(pod, "status", "conditions", default=[]) if isinstance(c, Mapping))


def serving_port(pod: Obj, *, default: int) -> int:
    """The container port named `http` (the cache's), else `default` (--peer-port)."""
    for container in _get(pod, "spec", "containers", default=[]):
        for port in _get(container, "ports", default=[]):
            if port.get("name") == "http" and isinstance(port.get("containerPort"), int):
                return port["containerPort"]
    return default


def address(pod: Obj, *, statefulset: Obj, namespace: str, peer_address: str, peer_port: int) -> str | None:
    """Where peers reach `pod`; None when it cannot be said yet (no IP assigned)."""
    port = serving_port(pod, default=peer_port)
    name = _get(pod, "metadata", "name")
    if peer_address == "pod-ip":
        ip = _get(pod, "status", "podIP")
        return f"{ip}:{port}" if ip else None
    service = _get(statefulset, "spec", "serviceName")
    if not service:
        return None
    return f"{name}.{service}.{namespace}.svc:{port}"


def leaving(pod: Obj, *, statefulset: Obj) -> bool:
    """A pod a scale-down removes: its ordinal is at or above the StatefulSet's replicas.

    The StatefulSet controller deletes it as soon as replicas drop, and a
    user's `kubectl scale` gives no earlier warning, so it leaves the ring
    at once, while it still runs and can hand its objects off.
    """
    replicas = _get(statefulset, "spec", "replicas")
    n = ordinal(_get(pod, "metadata", "name", default=""), _get(statefulset, "metadata", "name", default=""))
    return isinstance(replicas, int) and n is not None and n >= replicas


def members(pods: Iterable[Obj], *, statefulset: Obj, namespace: str, peer_address: str,
            peer_port: int) -> dict[str, str]:
    """node id -> address for every pod that belongs in the ring: ready, not being
    deleted, and not removed by a scale-down."""
    out: dict[str, str] = {}
    for pod in pods:
        if not is_member(pod) or leaving(pod, statefulset=statefulset):
            continue
        where = address(pod, statefulset=statefulset, namespace=namespace, peer_address=peer_address,
                        peer_port=peer_port)
        if where is not None:
            out[_get(pod, "metadata", "name")] = where
    return out


def pod_selector(statefulset: Obj) -> str | None:
    """The StatefulSet's own `spec.selector` as a label selector string; None if it has none.

    matchExpressions are kept (In, NotIn, Exists, DoesNotExist), so the pods
    watched are exactly those the StatefulSet owns.
    """
    selector = _get(statefulset, "spec", "selector")
    if not isinstance(selector, Mapping):
        return None
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts) or None


def ordinal(pod_name: str, statefulset_name: str) -> int | None:
    """The StatefulSet ordinal of `pod_name` (`nezha-cache-3` -> 3), None for another pod."""
    prefix = statefulset_name + "-"
    rest = pod_name[len(prefix):] if pod_name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None
