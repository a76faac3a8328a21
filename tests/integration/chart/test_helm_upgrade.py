"""`helm install` and `helm upgrade` with the real Helm 4 against the API double, and the real `kubectl scale`.

Both ways Helm writes: server-side apply (Helm 4's default) and the
three-way merge patches of Helm 3 (`--server-side=false`). The double
keeps field ownership as kube-apiserver does (testkit/kubeapi/apply.py), so
a chart that rendered its own `cache.replicas` over a live scale would
conflict (server-side apply) or reset it (three-way merge): the chart
renders the live value instead, and shares the field with whoever scaled.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess

import pytest
from kubernetes_asyncio import client

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.tools import require_tool
from tests.integration.chart.render import CHART

pytestmark = pytest.mark.timeout(180)


async def run(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, f"{' '.join(args[:3])}... exited {proc.returncode}:\n{out.decode()[-3000:]}"
    return out.decode()


@pytest.fixture
async def cluster(kube_api, tmp_path):
    """(helm, kubectl) command prefixes aimed at the double, and an API client."""
    config = str(kubeconfig(tmp_path / "kubeconfig", kube_api.url))
    helm = [require_tool("helm"), "--kubeconfig", config]
    kubectl = [require_tool("kubectl"), "--kubeconfig", config]
    await run(*kubectl, "create", "namespace", "nezha")
    api = kube_api.client()
    try:
        yield helm, kubectl, api
    finally:
        await api.close()


# The double serves no OpenAPI documents; the chart's schemas are checked in test_chart.py.
NO_OPENAPI = "--disable-openapi-validation"


@pytest.mark.parametrize("server_side", ["true", "false"], ids=["helm4-server-side-apply", "three-way-merge"])
async def test_helm_upgrade_keeps_a_kubectl_scale_and_the_generated_secrets(cluster, server_side):
    helm, kubectl, api = cluster
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    await run(*helm, "install", "nezha", str(CHART), "-n", "nezha", NO_OPENAPI, f"--server-side={server_side}")
    sts = await apps.read_namespaced_stateful_set("nezha-cache", "nezha")
    assert sts.spec.replicas == 3
    token = (await core.read_namespaced_secret("nezha-cluster-token", "nezha")).data["token"]
    password = (await core.read_namespaced_secret("nezha-redis", "nezha")).data["password"]
    assert len(base64.b64decode(token)) >= 32

    await run(*kubectl, "-n", "nezha", "scale", "statefulset", "nezha-cache", "--replicas=5")
    await run(*helm, "upgrade", "nezha", str(CHART), "-n", "nezha", NO_OPENAPI, f"--server-side={server_side}",
              "--set", "cache.capacity=40GiB")

    sts = await apps.read_namespaced_stateful_set("nezha-cache", "nezha")
    assert sts.spec.replicas == 5, "helm upgrade undid kubectl scale"
    # The upgrade did reach the StatefulSet: its nodes get the new capacity.
    (container,) = sts.spec.template.spec.containers
    assert "--capacity=40GiB" in container.args
    assert (await core.read_namespaced_secret("nezha-cluster-token", "nezha")).data["token"] == token
    assert (await core.read_namespaced_secret("nezha-redis", "nezha")).data["password"] == password
    # Each revision runs the certificates Job again.
    jobs = await client.BatchV1Api(api).list_namespaced_job("nezha")
    assert [j.metadata.name for j in jobs.items] == ["nezha-webhook-certs-2"]


@pytest.mark.parametrize("server_side", ["true", "false"], ids=["helm4-server-side-apply", "three-way-merge"])
async def test_helm_upgrade_keeps_the_ca_bundle_the_certificates_job_patched_in(cluster, server_side):
    helm, _, api = cluster
    registrations = client.AdmissionregistrationV1Api(api)
    await run(*helm, "install", "nezha", str(CHART), "-n", "nezha", NO_OPENAPI, f"--server-side={server_side}")
    bundle = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...\n").decode()
    # As `nezha webhook certs` writes it: a patch of the caBundle alone, under its own field manager.
    await registrations.patch_mutating_webhook_configuration(
        "nezha-webhook", [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}],
        field_manager="nezha-webhook-certs")
    await run(*helm, "upgrade", "nezha", str(CHART), "-n", "nezha", NO_OPENAPI, f"--server-side={server_side}",
              "--set", "webhook.timeoutSeconds=4")
    (hook,) = (await registrations.read_mutating_webhook_configuration("nezha-webhook")).webhooks
    assert hook.timeout_seconds == 4, "the upgrade did not reach the registration"
    assert hook.client_config.ca_bundle == bundle, "helm upgrade reset the caBundle"
