"""The cache Service's ClusterIP, kept current with a list and a watch.

Rules may leave `ip` out; pods then get the ClusterIP of the cache Service,
learned here rather than typed by hand. The loop is list, then watch from the
list's resourceVersion, resuming from the last version seen when a stream ends,
and relisting when the API answers 410 Gone (the version is too old) or the
connection fails. A deleted Service clears the IP: until it returns, rules
without `ip` are skipped with a warning and pods download directly, which is
failing open.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from nezha.config import WebhookSettings
from nezha.errors import ConfigError
from nezha.kube import api_client as kube_api_client

log = structlog.get_logger("nezha.webhook.discovery")


async def api_client(*, kubeconfig: Path | None = None) -> client.ApiClient:
    """The webhook's way in: nezha.kube.api_client, naming its own fallback flag."""
    return await kube_api_client(kubeconfig=kubeconfig,
                                 hint="pass --kubeconfig, or --cache-ip to name the cache address")


def cluster_ip(service: Any) -> str | None:
    """The Service's ClusterIP, or None for a headless Service or one without an IP yet."""
    ip = getattr(getattr(service, "spec", None), "cluster_ip", None)
    return ip if ip and ip != "None" else None


class ServiceWatcher:
    """Calls `on_ip` with the Service's ClusterIP whenever it changes (None when it is gone).

    Every request has a client-side deadline. The server ends a watch after
    `watch_timeout` seconds, so a stream still open `watch_grace` seconds
    later is on a connection that died without a FIN (a half-open one, after
    a NAT or load-balancer reset): it is abandoned and the watcher relists,
    instead of waiting on it forever while the IP goes stale.
    """

    def __init__(self, *, api: client.ApiClient, namespace: str, name: str, on_ip: Callable[[str | None], Any],
                 watch_timeout: int = 300, watch_grace: float = 15.0, list_timeout: float = 30.0,
                 retry_delay: float = 1.0) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace, self.name = namespace, name
        self.on_ip = on_ip
        self.watch_timeout = watch_timeout
        self.watch_grace = watch_grace
        self.list_timeout = list_timeout
        self.retry_delay = retry_delay
        self.ip: str | None = None
        self.relists = 0

    def _set(self, ip: str | None) -> None:
        if ip != self.ip:
            log.info("cache_ip_changed", service=f"{self.namespace}/{self.name}", old=self.ip, new=ip)
            self.ip = ip
            self.on_ip(ip)

    async def run(self) -> None:
        """Forever: list, then watch; relist on 410 or a failed connection."""
        while True:
            try:
                version = await self._list()
                await self._watch(version)
            except ApiException as e:
                if e.status == 410:
                    log.info("service_watch_expired", service=f"{self.namespace}/{self.name}")
                    continue
                log.warning("service_watch_failed", service=f"{self.namespace}/{self.name}", status=e.status,
                            error=str(e.reason))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                log.warning("service_watch_failed", service=f"{self.namespace}/{self.name}",
                            error=f"{type(e).__name__}: {e}")
            except Exception:  # a dead watcher would leave the IP stale forever
                log.exception("service_watch_failed", service=f"{self.namespace}/{self.name}")
            await asyncio.sleep(self.retry_delay)

    async def _list(self) -> str:
        self.relists += 1
        listed = await self.core.list_namespaced_service(self.namespace, field_selector=f"metadata.name={self.name}",
                                                         _request_timeout=self.list_timeout)
        self._set(cluster_ip(listed.items[0]) if listed.items else None)
        return listed.metadata.resource_version

    async def _watch(self, version: str) -> None:
        """Stream changes from `version`; returns only by raising (410, a connection error, or the deadline)."""
        while True:
            watch = Watch()
            try:
                async for event in watch.stream(self.core.list_namespaced_service, self.namespace,
                                                field_selector=f"metadata.name={self.name}",
                                                resource_version=version, allow_watch_bookmarks=True,
                                                timeout_seconds=self.watch_timeout,
                                                _request_timeout=self.watch_timeout + self.watch_grace):
                    kind = event["type"]
                    if kind in ("ADDED", "MODIFIED"):
                        self._set(cluster_ip(event["object"]))
                    elif kind == "DELETED":
                        self._set(None)
                version = watch.resource_version or version
            finally:
                await watch.close()


def service_follower(*, settings: WebhookSettings, on_ip: Callable[[str | None], Any],
                     api: client.ApiClient | None = None) -> Callable[[], Awaitable[None]]:
    """A coroutine function for `Webhook.discovery`: reach the API, then watch the cache Service until cancelled.

    `api` is a client the command made at start-up (the caller closes it);
    without one each run makes its own. Without cluster access a run logs
    `service_watch_unavailable`, naming what to pass, and ends; the next rules
    reload that needs the IP tries again.
    """
    service = f"{settings.namespace}/{settings.cache_service}"

    async def follow() -> None:
        own = None
        if api is None:
            try:
                own = await api_client(kubeconfig=settings.kubeconfig)
            except ConfigError as e:
                log.error("service_watch_unavailable", service=service, error=str(e))
                return
        try:
            await ServiceWatcher(api=api or own, namespace=settings.namespace, name=settings.cache_service,
                                 on_ip=on_ip).run()
        finally:
            if own is not None:
                await own.close()

    return follow
