"""The Nezha CA bundle, copied into every namespace where a labelled pod may mount it.

`nezha ca init` writes ConfigMap `nezha-ca` once, in the release namespace;
the webhook gives matched pods a volume naming `nezha-ca`, and a ConfigMap
volume can only name a ConfigMap in the pod's own namespace. So the leader
keeps a copy in every namespace, as kube-controller-manager publishes
`kube-root-ca.crt`: made when a namespace appears, rewritten when the source
changes (a rotated CA) or someone edits the copy, put back when deleted.
A pod admitted before its namespace's copy exists waits in
ContainerCreating, and kubelet mounts the volume as soon as the copy lands.

A ConfigMap of that name that the controller did not make (no managed-by
label) is the user's: it is left alone, and said once in the log.

`publications` is the pure decision; `TrustPublisher` applies it from two
watches (namespaces; ConfigMaps of that name in all namespaces).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nezha import trust_bundle
from nezha.informer import Informer
from nezha.cancels import stop_if_cancelled

log = structlog.get_logger("nezha.controller.trust")

MANAGED_BY = ("app.kubernetes.io/managed-by", "nezha-controller")
SOURCE_ANNOTATION = "nezha.io/ca-source"
# Namespaces where no training pod runs: the control plane's own.
SKIPPED = frozenset({"kube-system", "kube-public", "kube-node-lease"})
RETRY_S = 0.5


@dataclass(frozen=True)
class Publication:
    namespace: str
    verb: str  # "create" or "replace"
    resource_version: str | None = None  # of the copy replaced


def publications(*, source: dict | None, source_namespace: str, namespaces: dict[str, dict],
                 copies: dict[str, dict]) -> tuple[list[Publication], list[str]]:
    """What to write so every namespace holds the source's data; and the namespaces whose
    ConfigMap of that name is someone else's. Pure. `namespaces` and `copies` by namespace name."""
    if source is None or not source.get("data"):
        return [], []
    data = source["data"]
    writes: list[Publication] = []
    foreign: list[str] = []
    for ns in sorted(namespaces):
        obj = namespaces[ns]
        if ns == source_namespace or ns in SKIPPED:
            continue
        if (obj.get("metadata") or {}).get("deletionTimestamp") or (obj.get("status") or {}).get("phase") == \
                "Terminating":
            continue  # creating into a terminating namespace is refused anyway
        copy = copies.get(ns)
        if copy is None:
            writes.append(Publication(ns, "create"))
            continue
        meta = copy.get("metadata") or {}
        if (meta.get("labels") or {}).get(MANAGED_BY[0]) != MANAGED_BY[1]:
            foreign.append(ns)
            continue
        if copy.get("data") != data:
            writes.append(Publication(ns, "replace", meta.get("resourceVersion")))
    return writes, foreign


class TrustPublisher:
    def __init__(self, *, api: client.ApiClient, namespace: str, leading: Callable[[], bool],
                 name: str = trust_bundle.CONFIGMAP) -> None:
        self.namespace = namespace
        self.name = name
        self.leading = leading
        self._core = client.CoreV1Api(api)
        self._wake = asyncio.Event()
        self.namespaces = Informer(kind="namespace", list_fn=self._core.list_namespace, namespace=None,
                                   on_change=self._wake.set)
        self.configmaps = Informer(kind="configmap", list_fn=self._core.list_config_map_for_all_namespaces,
                                   namespace=None, field_selector=f"metadata.name={name}",
                                   on_change=self._wake.set)
        self._foreign_said: set[str] = set()
        self.written = 0

    def wake(self) -> None:
        """Look again (leadership changed)."""
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled."""
        tasks = [asyncio.get_running_loop().create_task(i.run()) for i in (self.namespaces, self.configmaps)]
        try:
            while True:
                stop_if_cancelled()
                await self._wake.wait()
                self._wake.clear()
                if not (self.leading() and self.namespaces.synced.is_set() and self.configmaps.synced.is_set()):
                    continue
                try:
                    await self._publish()
                except Exception:  # noqa: BLE001 - the loop must outlive any one failed pass
                    log.exception("ca_publish_failed")
                    asyncio.get_running_loop().call_later(RETRY_S * 4, self._wake.set)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _publish(self) -> None:
        copies = {key.split("/", 1)[0]: obj for key, obj in self.configmaps.objects.items()}
        source = copies.get(self.namespace)
        namespaces = {key.rsplit("/", 1)[-1]: obj for key, obj in self.namespaces.objects.items()}
        writes, foreign = publications(source=source, source_namespace=self.namespace, namespaces=namespaces,
                                       copies=copies)
        for ns in foreign:
            if ns not in self._foreign_said:
                self._foreign_said.add(ns)
                log.warning("ca_copy_foreign", namespace=ns, configmap=self.name,
                            reason="a ConfigMap of this name exists and was not made by the controller; left "
                                   "alone: labelled pods here mount it as their CA bundle")
        retry = False
        for p in writes:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": self.name, "namespace": p.namespace, "labels": dict([MANAGED_BY]),
                                 "annotations": {SOURCE_ANNOTATION: f"{self.namespace}/{self.name}"}},
                    "data": dict(source["data"])}
            try:
                if p.verb == "create":
                    await self._core.create_namespaced_config_map(p.namespace, body)
                else:
                    body["metadata"]["resourceVersion"] = p.resource_version
                    await self._core.replace_namespaced_config_map(self.name, p.namespace, body)
            except ApiException as e:
                if e.status in (404, 409, 403):  # gone, changed under us, or terminating: the watches will say
                    log.info("ca_copy_deferred", namespace=p.namespace, status=e.status, reason=str(e.reason))
                    retry = e.status == 409
                    continue
                raise
            self.written += 1
            log.info("ca_copy_written", namespace=p.namespace, verb=p.verb)
        if retry:  # a copy changed under us: look again once the watch has had time to say how
            asyncio.get_running_loop().call_later(RETRY_S, self._wake.set)
