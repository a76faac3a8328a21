"""The workload kinds that start pods and may carry `nezha.io/prefetch`, and how each is listed and patched.

Jobs, Deployments and StatefulSets are built into every cluster.
LeaderWorkerSets (inference replicas of a model across several pods) and
JobSets (multi-slice training) are custom resources: they are watched only
where discovery (`GET /apis`, what every client reads and every identity
may read, `system:discovery`) shows their group at the version known here,
looked up again every REDISCOVER seconds so a CRD applied after the
controller started is picked up without a restart. An informer per kind
watches every namespace; the controller's ClusterRole grants `list`,
`watch` and `patch` on these kinds and nothing more (docs/rbac.md).

Status is written with a JSON merge patch of the object's annotations
alone: no spec field changes, so no Deployment rolls and no pod restarts.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

REDISCOVER = 300.0  # seconds between two discoveries of the custom kinds
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Kind:
    name: str  # as in an object's `kind`
    group: str
    version: str
    plural: str
    custom: bool = False  # a custom resource: watched only where discovery finds it

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


JOB = Kind("Job", "batch", "v1", "jobs")
DEPLOYMENT = Kind("Deployment", "apps", "v1", "deployments")
STATEFULSET = Kind("StatefulSet", "apps", "v1", "statefulsets")
LEADER_WORKER_SET = Kind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", custom=True)
JOB_SET = Kind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", custom=True)
KINDS = (JOB, DEPLOYMENT, STATEFULSET, LEADER_WORKER_SET, JOB_SET)
BY_NAME = {k.name: k for k in KINDS}


def list_all(api: client.ApiClient, kind: Kind) -> Callable[..., Awaitable[Any]]:
    """The list function of `kind` across every namespace, as nezha/informer.py calls it (and watches with)."""
    if kind == JOB:
        return client.BatchV1Api(api).list_job_for_all_namespaces
    if kind == DEPLOYMENT:
        return client.AppsV1Api(api).list_deployment_for_all_namespaces
    if kind == STATEFULSET:
        return client.AppsV1Api(api).list_stateful_set_for_all_namespaces
    listed = functools.partial(client.CustomObjectsApi(api).list_cluster_custom_object,
                               kind.group, kind.version, kind.plural)
    # kubernetes-asyncio's Watch reads the parameter's name (`watch` or `follow`) off the doc.
    functools.update_wrapper(listed, client.CustomObjectsApi.list_cluster_custom_object)
    return listed


async def patch_annotations(api: client.ApiClient, obj: dict, annotations: dict[str, str | None]) -> None:
    """Merge `annotations` into `obj`'s (None removes one): a JSON merge patch of metadata alone."""
    meta = obj.get("metadata") or {}
    kind = BY_NAME[obj["kind"]]
    body = {"metadata": {"annotations": annotations}}
    name, namespace = meta["name"], meta["namespace"]
    if kind == JOB:
        await client.BatchV1Api(api).patch_namespaced_job(name, namespace, body, _content_type=MERGE_PATCH)
    elif kind == DEPLOYMENT:
        await client.AppsV1Api(api).patch_namespaced_deployment(name, namespace, body, _content_type=MERGE_PATCH)
    elif kind == STATEFULSET:
        await client.AppsV1Api(api).patch_namespaced_stateful_set(name, namespace, body, _content_type=MERGE_PATCH)
    else:
        await client.CustomObjectsApi(api).patch_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name, body, _content_type=MERGE_PATCH)


def served(groups: dict) -> set[Kind]:
    """The custom kinds a discovery document (`GET /apis`, as JSON) serves at the version known here."""
    versions = {g.get("name"): {v.get("version") for v in g.get("versions") or []}
                for g in groups.get("groups") or []}
    return {k for k in KINDS if k.custom and k.version in versions.get(k.group, set())}


async def discover(api: client.ApiClient) -> set[Kind]:
    """The custom kinds this cluster serves (`GET /apis`)."""
    response = await client.ApisApi(api).get_api_versions(_preload_content=False)
    try:
        return served(json.loads(await response.read()))
    finally:
        response.release()
