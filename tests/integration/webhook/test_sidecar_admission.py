"""The sidecar model through the API double: a Job's pod gets its native sidecar from the real webhook over TLS,
and a cluster whose /version predates native sidecars gets the centralized model, said in the log and on the pod."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from nezha.config import WebhookSettings
from testkit.ports import free_port
from tests.integration.webhook.registration import namespace, register
from webhook import sidecar as sc
from webhook.discovery import version_follower
from webhook.server import build_webhook, start

RULES = """\
- name: datasets
  app: nezha.io/cache
  label: "true"
  deployment: sidecar
  hostAliases:
    - hostnames: [www.cs.toronto.edu]
"""


@pytest.fixture
async def sidecar_webhook(tls, tmp_path, kube, kube_api):
    """A webhook with sidecar settings whose server version is read from the double by version_follower."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    settings = WebhookSettings(listen=f"127.0.0.1:{free_port()}", tls_cert=tls.cert, tls_key=tls.key, rules=rules,
                               cache_ip="10.96.0.10", watch_service=False, sidecar_image="nezha:test",
                               sidecar_origins={"www.cs.toronto.edu": "http://127.0.0.1:1"})
    hook = build_webhook(settings)
    hook.version_discovery = version_follower(settings=settings, api=kube, on_version=hook.set_server_version,
                                              retry=0.05)
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"https://127.0.0.1:{settings.listen_addr[1]}/mutate")
    yield hook, kube_api, kube, start


async def job_pod(kube_api, kube, name: str) -> dict:
    await client.BatchV1Api(kube).create_namespaced_job("ml", {
        "metadata": {"name": name}, "spec": {"template": {
            "metadata": {"labels": {"nezha.io/cache": "true"}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "train", "image": "busybox", "command": ["wget", "http://www.cs.toronto.edu/x"]}]}}}})
    for _ in range(200):
        found = [p for (ns, _), p in kube_api.objects_of("", "pods").items()
                 if ns == "ml" and p["metadata"]["labels"].get("job-name") == name]
        if found:
            return found[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no pod for Job {name}; job errors: {kube_api.job_errors}")


async def until(predicate, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_labelled_jobs_pod_gets_the_native_sidecar_once_the_server_version_is_read(sidecar_webhook):
    hook, kube_api, kube, start_ = sidecar_webhook
    runner = await start_(hook)
    try:
        await until(lambda: hook.sidecar.server_version == (1, 35))
        pod = await job_pod(kube_api, kube, "train")
        (side,) = pod["spec"]["initContainers"]
        assert side["name"] == sc.CONTAINER and side["restartPolicy"] == "Always" and side["image"] == "nezha:test"
        assert "--origin=www.cs.toronto.edu=http://127.0.0.1:1" in side["args"]
        assert pod["spec"]["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["www.cs.toronto.edu"]}]
        assert pod["metadata"]["annotations"][sc.STATUS_ANNOTATION] == "sidecar"
    finally:
        await runner.cleanup()


async def test_on_a_cluster_older_than_1_29_the_pod_is_centralized_and_the_log_and_status_say_why(sidecar_webhook):
    hook, kube_api, kube, start_ = sidecar_webhook
    kube_api.version = ("1", "28+")
    runner = await start_(hook)
    try:
        await until(lambda: hook.sidecar.server_version == (1, 28))
        with capture_logs() as logs:
            pod = await job_pod(kube_api, kube, "train-old")
        assert "initContainers" not in pod["spec"]
        assert pod["spec"]["hostAliases"] == [{"ip": "10.96.0.10", "hostnames": ["www.cs.toronto.edu"]}]
        status = pod["metadata"]["annotations"][sc.STATUS_ANNOTATION]
        assert status.startswith("centralized: Kubernetes 1.28 has no native sidecars"), status
        fallbacks = [e for e in logs if e["event"] == "sidecar_fallback"]
        assert fallbacks and "1.28" in fallbacks[0]["why"] and fallbacks[0]["namespace"] == "ml"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("settings,named", [
    ({"sidecar_size": "512Mi"}, "sidecar_size ('512Mi') must be a Kubernetes quantity of at least 1Gi"),
    ({"sidecar_size": "lots"}, "sidecar_size ('lots')"),
    ({"kubernetes_version": "latest"}, "kubernetes_version ('latest') must be MAJOR.MINOR"),
    ({"sidecar_image_pull_policy": "Sometimes"}, "sidecar_image_pull_policy ('Sometimes')"),
    ({"sidecar_resources": {"requests": {"cpu": ""}}}, "sidecar_resources.requests.cpu ('')"),
    ({"sidecar_resources": {"claims": {}}}, "sidecar_resources has 'claims'"),
])
def test_bad_sidecar_settings_stop_the_webhook_at_start_naming_the_field(tls, rules_file, settings, named):
    from nezha.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        build_webhook(WebhookSettings(tls_cert=tls.cert, tls_key=tls.key, rules=rules_file, cache_ip="10.96.0.10",
                                      watch_service=False, **settings))
    assert named in str(e.value)


def test_a_kubernetes_version_setting_stands_in_for_discovery(tls, rules_file):
    hook = build_webhook(WebhookSettings(tls_cert=tls.cert, tls_key=tls.key, rules=rules_file, cache_ip="10.96.0.10",
                                         watch_service=False, sidecar_image="nezha:test", kubernetes_version="v1.31.2"))
    assert hook.sidecar.server_version == (1, 31)
