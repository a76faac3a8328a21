"""The resources the double serves, and label selectors (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    scale: bool = False
    custom: bool = False  # defined by a CRD: no strategic merge patch (kube-apiserver answers 415)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


RESOURCES = [
    Resource("", "v1", "pods", "Pod"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "services", "Service"),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "events", "Event"),
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("batch", "v1", "jobs", "Job"),
    Resource("apps", "v1", "statefulsets", "StatefulSet", scale=True),
    Resource("apps", "v1", "deployments", "Deployment", scale=True),
    Resource("coordination.k8s.io", "v1", "leases", "Lease"),
    Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
             "MutatingWebhookConfiguration", namespaced=False),
    # What the chart creates beside them; stored and served, no behaviour of their own.
    Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    Resource("batch", "v1", "cronjobs", "CronJob"),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    # Custom resources of the Prometheus Operator, served as a cluster that has its CRDs installed
    # serves them: what the chart's metrics switches create (docs/metrics.md).
    Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor", custom=True),
    Resource("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule", custom=True),
]
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
# Custom resources a cluster serves once their CRDs are applied; the double serves each only after
# `KubeAPI.install_crd` (its discovery then lists it, as kube-apiserver's does once a CRD is established).
LEADER_WORKER_SETS = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet", scale=True,
                              custom=True)
JOB_SETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", custom=True)


class BadSelector(ValueError):
    pass


def parse_label_selector(text: str | None) -> list[tuple[str, str, tuple[str, ...]]]:
    """`a=b,c!=d,e,!f,g in (x,y),h notin (z)` -> [(key, op, values)]."""
    if not text:
        return []
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for p in (p.strip() for p in parts if p.strip()):
        for word, op in ((" notin ", "NotIn"), (" in ", "In")):
            if word in p:
                key, _, values = p.partition(word)
                out.append((key.strip(), op, tuple(v.strip() for v in values.strip().strip("()").split(","))))
                break
        else:
            if "!=" in p:
                k, _, v = p.partition("!=")
                out.append((k.strip(), "NotIn", (v.strip(),)))
            elif "==" in p or "=" in p:
                k, _, v = p.replace("==", "=").partition("=")
                out.append((k.strip(), "In", (v.strip(),)))
            elif p.startswith("!"):
                out.append((p[1:].strip(), "DoesNotExist", ()))
            else:
                out.append((p, "Exists", ()))
    return out


def selector_terms(selector: dict[str, Any] | None) -> list[tuple[str, str, tuple[str, ...]]]:
    """A metav1.LabelSelector (matchLabels, matchExpressions) as terms; None or {} selects everything."""
    if not selector:
        return []
    terms = [(k, "In", (v,)) for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        if e.get("operator") not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise BadSelector(f"matchExpressions operator {e.get('operator')!r} is not supported")
        terms.append((e["key"], e["operator"], tuple(e.get("values") or ())))
    return terms


def matches(terms: list[tuple[str, str, tuple[str, ...]]], labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    for key, op, values in terms:
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch.

    With `strategic`, lists of objects that all carry `name` (containers, env,
    webhooks, ports: the lists Nezha patches) merge by name, as their Kubernetes
    patchMergeKey says; every other list is replaced. No `$patch` directives.
    """
    if strategic and _named_list(target) and _named_list(patch):
        merged = {item["name"]: item for item in target}
        order = [item["name"] for item in target]
        for item in patch:
            if item["name"] not in merged:
                order.append(item["name"])
            merged[item["name"]] = merge_patch(merged.get(item["name"]), item, strategic=True)
        return [merged[n] for n in order]
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v, strategic=strategic)
    return result


def _named_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(i, dict) and "name" in i for i in v)


VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def api_versions() -> dict[str, Any]:
    """`GET /api`: the core group's versions."""
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}


def api_groups(resources: list[Resource] = RESOURCES) -> dict[str, Any]:
    """`GET /apis`: the legacy (unaggregated) discovery document every client falls back to."""
    groups: dict[str, list[str]] = {}
    for r in resources:
        if r.group and r.version not in groups.setdefault(r.group, []):
            groups[r.group].append(r.version)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
         "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
        for g, vs in sorted(groups.items())]}


def api_resources(group: str, version: str, resources: list[Resource] = RESOURCES) -> dict[str, Any] | None:
    """`GET /api/v1` or `/apis/GROUP/VERSION`: the resources and subresources, as kubectl maps kinds with."""
    served = [r for r in resources if (r.group, r.version) == (group, version)]
    if not served:
        return None
    listed: list[dict[str, Any]] = []
    for r in served:
        listed.append({"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                       "kind": r.kind, "verbs": VERBS})
        if r.plural in ("pods", "jobs", "statefulsets", "deployments", "poddisruptionbudgets", "cronjobs",
                        "leaderworkersets", "jobsets"):
            listed.append({"name": f"{r.plural}/status", "singularName": "", "namespaced": r.namespaced,
                           "kind": r.kind, "verbs": ["get", "patch", "update"]})
        if r.scale:
            listed.append({"name": f"{r.plural}/scale", "singularName": "", "namespaced": r.namespaced,
                           "group": "autoscaling", "version": "v1", "kind": "Scale",
                           "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": listed}
