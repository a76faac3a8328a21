"""Rules without `ip` follow the cache Service's ClusterIP, learned with a watch."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from nezha.config import WebhookSettings
from testkit.ports import free_port
from tests.integration.webhook.registration import namespace, register
from tests.integration.webhook.reviews import pod
from webhook.discovery import ServiceWatcher
from webhook.server import build_webhook, start

RULES = """\
- name: dataset
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases:
    - hostnames: [www.cs.toronto.edu]
"""


@pytest.fixture
async def discovering(tls, tmp_path, kube, kube_api):
    """A webhook whose cache IP comes from a ServiceWatcher on nezha/nezha-cache in the API double."""
    rules = tmp_path / "rules-no-ip.yaml"
    rules.write_text(RULES)
    settings = WebhookSettings(listen=f"127.0.0.1:{free_port()}", tls_cert=tls.cert, tls_key=tls.key, rules=rules)
    hook = build_webhook(settings)
    watcher = ServiceWatcher(api=kube, namespace="nezha", name="nezha-cache", retry_delay=0.05,
                             on_ip=lambda ip: setattr(hook, "cache_ip", ip))
    hook.discovery = watcher.run
    runner = await start(hook)
    await namespace(kube, "nezha")
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"https://127.0.0.1:{settings.listen_addr[1]}/mutate")
    try:
        yield hook, watcher
    finally:
        await runner.cleanup()


async def until(predicate, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def cache_service(kube, ip: str | None = None):
    spec = {"ports": [{"port": 80}], "selector": {"app": "nezha-cache"}}
    if ip:
        spec["clusterIP"] = ip
    return await client.CoreV1Api(kube).create_namespaced_service("nezha", {"metadata": {"name": "nezha-cache"},
                                                                            "spec": spec})


async def alias_ips(kube):
    stored = await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    return [a.ip for a in stored.spec.host_aliases or []]


async def test_new_pods_follow_the_service_ip_when_it_changes(kube, discovering):
    hook, _ = discovering
    svc = await cache_service(kube)
    await until(lambda: hook.cache_ip == svc.spec.cluster_ip)
    assert await alias_ips(kube) == [svc.spec.cluster_ip]

    await client.CoreV1Api(kube).delete_namespaced_service("nezha-cache", "nezha")
    await until(lambda: hook.cache_ip is None)
    assert await alias_ips(kube) == []  # no cache: the pod downloads directly

    await cache_service(kube, "10.96.200.200")
    await until(lambda: hook.cache_ip == "10.96.200.200")
    assert await alias_ips(kube) == ["10.96.200.200"]


@pytest.mark.parametrize("abrupt", [False, True], ids=["410-gone-on-resume", "cut-connection"])
async def test_the_watcher_relists_after_410_or_a_cut_connection(kube, kube_api, discovering, abrupt):
    hook, watcher = discovering
    await cache_service(kube, "10.96.1.1")
    await until(lambda: hook.cache_ip == "10.96.1.1")
    relists = watcher.relists
    with capture_logs() as logs:
        kube_api.compact()
        await until(lambda: kube_api.drop_watches(abrupt=abrupt) > 0)
        await until(lambda: watcher.relists > relists)
    expected = "service_watch_failed" if abrupt else "service_watch_expired"
    assert expected in [e["event"] for e in logs]
    await client.CoreV1Api(kube).delete_namespaced_service("nezha-cache", "nezha")
    await cache_service(kube, "10.96.2.2")
    await until(lambda: hook.cache_ip == "10.96.2.2")
    assert await alias_ips(kube) == ["10.96.2.2"]


async def test_a_cleanly_ended_watch_resumes_without_relisting(kube, kube_api, discovering):
    hook, watcher = discovering
    await cache_service(kube, "10.96.3.3")
    await until(lambda: hook.cache_ip == "10.96.3.3")
    relists = watcher.relists
    await until(lambda: kube_api.drop_watches(abrupt=False) > 0)
    await client.CoreV1Api(kube).delete_namespaced_service("nezha-cache", "nezha")
    await until(lambda: hook.cache_ip is None)
    assert watcher.relists == relists


async def test_a_watch_that_goes_silent_is_abandoned_at_its_deadline_and_the_ip_follows_again(kube, kube_api):
    """A half-open connection: the stream neither ends at timeoutSeconds nor carries the change."""
    await namespace(kube, "nezha")
    await cache_service(kube, "10.96.4.4")
    watcher = ServiceWatcher(api=kube, namespace="nezha", name="nezha-cache", watch_timeout=1, watch_grace=0.5,
                             retry_delay=0.05, on_ip=lambda ip: None)
    task = asyncio.create_task(watcher.run())
    try:
        await until(lambda: watcher.ip == "10.96.4.4")
        await until(lambda: kube_api.stall_watches() > 0)
        relists = watcher.relists
        with capture_logs() as logs:
            await client.CoreV1Api(kube).delete_namespaced_service("nezha-cache", "nezha")
            await cache_service(kube, "10.96.5.5")
            await until(lambda: watcher.ip == "10.96.5.5", timeout=8)
        assert watcher.relists > relists
        [failed] = [e for e in logs if e["event"] == "service_watch_failed"]
        assert "Timeout" in failed["error"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
