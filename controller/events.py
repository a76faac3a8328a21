"""Kubernetes Events: where the controller tells users what it did and what was wrong.

`kubectl describe statefulset nezha-cache` is where an operator looks, so
a bad annotation, a scale step or a drain is an Event on the object it is
about (core/v1, the API every kubectl reads). Recording one must never stop
the controller: a failure to write it is logged and dropped.
"""

from __future__ import annotations

import datetime as dt
from typing import Callable

import structlog
from kubernetes_asyncio import client

log = structlog.get_logger("nezha.controller.events")

MAX_MESSAGE = 1024  # kube-apiserver truncates longer messages anyway


class EventRecorder:
    def __init__(self, *, api: client.ApiClient, namespace: str, component: str, host: str,
                 allowed: Callable[[], bool] = lambda: True,
                 counted: Callable[[str], None] = lambda reason: None) -> None:
        """`allowed()`: whether this replica may write now (it leads); a standby records nothing.
        `counted(reason)` hears of every Event recorded, also one the API refuses (controller/metrics.py)."""
        self.allowed = allowed
        self.counted = counted
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.component = component
        self.host = host
        self.sent = 0

    async def emit(self, obj: dict, type_: str, reason: str, message: str) -> None:
        """One Event of `type_` (Normal or Warning) about `obj` (its API JSON)."""
        if not self.allowed():
            return
        self.counted(reason)
        meta = obj.get("metadata") or {}
        # An Event lives in the namespace of the object it is about (kube-apiserver
        # refuses another): a Job's in its user's namespace.
        namespace = meta.get("namespace") or self.namespace
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": namespace},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                               "name": meta.get("name"), "namespace": namespace,
                               "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "type": type_, "reason": reason, "message": message[:MAX_MESSAGE],
            "source": {"component": self.component, "host": self.host},
            "reportingComponent": self.component, "reportingInstance": self.host,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.core.create_namespaced_event(namespace, body)
            self.sent += 1
        except Exception as e:  # noqa: BLE001 - an API error, a timeout: an Event is never worth the controller
            log.warning("event_not_recorded", reason=reason, object=meta.get("name"),
                        error=f"{type(e).__name__}: {str(e)[:200]}")
