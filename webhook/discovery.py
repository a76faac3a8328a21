"""What the webhook learns from the cluster: the cache Service's ClusterIP, kept current with a list and a
watch, and the API server's version (`/version`), which says whether native sidecars exist.

Rules may leave `ip` out; pods then get the ClusterIP of the cache Service,
learned here rather than typed by hand. The list and watch are the shared
informer's (nezha/informer.py) on the one Service, by field selector: it
resumes from the last version seen when a stream ends, and relists when the
API answers 410 Gone (the version is too old) or the connection fails. The
IP is derived from what the informer holds after each change. A deleted
Service clears the IP: until it returns, rules without `ip` are skipped with
a warning and pods download directly, which is failing open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Awaitable, Callable

import asyncio
import json

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nezha.config import WebhookSettings
from nezha.errors import ConfigError
from nezha.informer import Events, Informer
from nezha.kube import api_client as kube_api_client
from webhook.sidecar import parse_version

log = structlog.get_logger("nezha.webhook.discovery")


async def api_client(*, kubeconfig: Path | None = None) -> client.ApiClient:
    """The webhook's way in: nezha.kube.api_client, naming its own fallback flag."""
    return await kube_api_client(kubeconfig=kubeconfig,
                                 hint="pass --kubeconfig, or --cache-ip to name the cache address")


def cluster_ip(service: dict | None) -> str | None:
    """The Service's ClusterIP, or None for a headless Service, one without an IP yet, or none at all."""
    ip = ((service or {}).get("spec") or {}).get("clusterIP")
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
        self.namespace, self.name = namespace, name
        self.on_ip = on_ip
        self.ip: str | None = None
        # Events keep the names the webhook has always logged (docs and tests name them).
        self.informer = Informer(kind="service", list_fn=client.CoreV1Api(api).list_namespaced_service,
                                 namespace=namespace, field_selector=f"metadata.name={name}",
                                 on_change=self._changed, watch_timeout=watch_timeout, watch_grace=watch_grace,
                                 list_timeout=list_timeout, backoff=(retry_delay, retry_delay),
                                 relist_after_failure=True, logger=log.bind(service=f"{namespace}/{name}"),
                                 events=Events(expired="service_watch_expired", failed="service_watch_failed"))

    @property
    def relists(self) -> int:
        """The informer's lists: the watcher makes none of its own."""
        return self.informer.relists

    def _changed(self) -> None:
        ip = cluster_ip(self.informer.objects.get(self.name))
        if ip != self.ip:
            log.info("cache_ip_changed", service=f"{self.namespace}/{self.name}", old=self.ip, new=ip)
            self.ip = ip
            self.on_ip(ip)

    async def run(self) -> None:
        """Forever, until cancelled: the informer's loop, which outlives every API and connection failure."""
        await self.informer.run()


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


def version_follower(*, settings: WebhookSettings, on_version: Callable[[tuple[int, int] | None], Any],
                     api: client.ApiClient | None = None, retry: float = 10.0,
                     recheck: float = 600.0) -> Callable[[], Awaitable[None]]:
    """A coroutine function that reads the API server's version (GET /version) until cancelled.

    Until a read succeeds the version is unknown and pods asking for a
    sidecar stay centralized (their nezha.io/status says so); a failed read
    is retried every `retry` seconds, a good one repeated every `recheck`
    seconds (a control plane upgraded under a running webhook).
    """

    async def follow() -> None:
        own = None
        if api is None:
            try:
                own = await api_client(kubeconfig=settings.kubeconfig)
            except ConfigError as e:
                log.error("server_version_unavailable", error=str(e))
                return
        seen: tuple[int, int] | None = None
        try:
            while True:
                try:
                    # Raw JSON: only major and minor matter, and the generated model
                    # refuses answers that leave out fields such as buildDate.
                    response = await client.VersionApi(api or own).get_code(_request_timeout=30,
                                                                            _preload_content=False)
                    try:
                        info = json.loads(await response.read())
                    finally:
                        response.release()
                    major, minor = (info.get("major"), info.get("minor")) if isinstance(info, dict) else (None, None)
                    version = parse_version(major, minor)
                    if version is None:
                        raise ValueError(f"major {major!r}, minor {minor!r} are not numbers")
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - any failure is retried; the log names it
                    why = f"{e.status} {e.reason}" if isinstance(e, ApiException) else f"{type(e).__name__}: {e}"
                    log.warning("server_version_failed", error=why[:300])
                    await asyncio.sleep(retry)
                    continue
                if version != seen:
                    log.info("server_version", version=f"{version[0]}.{version[1]}", git=str(info.get("gitVersion")))
                    seen = version
                    on_version(version)
                await asyncio.sleep(recheck)
        finally:
            if own is not None:
                await own.close()

    return follow
