"""`nezha webhook certs` against the API double: mint, store, patch caBundle, renew only when due.

Double only (they take `kube_api`): against a real cluster they would register a webhook there.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import sys

import pytest
from kubernetes_asyncio import client

from nezha.config import WebhookSettings
from nezha.errors import ConfigError
from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.ports import free_port
from tests.integration.webhook.conftest import RULES
from tests.integration.webhook.registration import configuration, namespace
from tests.integration.webhook.reviews import pod
from webhook.certs import Pair, ensure_certs
from webhook.server import build_webhook, start

NOW = dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc)
SETTINGS = WebhookSettings(namespace="nezha", cert_days=90, renew_days=30)


async def install(kube):
    """Namespaces and the shipped registration, caBundle still empty, pointed at the Service."""
    await namespace(kube, "nezha")
    await namespace(kube, "ml")
    mwc = configuration(ca_pem=b"")
    mwc["webhooks"][0]["clientConfig"]["caBundle"] = ""
    await client.AdmissionregistrationV1Api(kube).create_mutating_webhook_configuration(mwc)


async def secret(kube, name):
    s = await client.CoreV1Api(kube).read_namespaced_secret(name, "nezha")
    return s, {k: base64.b64decode(v) for k, v in s.data.items()}


async def ca_bundle(kube) -> bytes:
    mwc = await client.AdmissionregistrationV1Api(kube).read_mutating_webhook_configuration("nezha-webhook")
    return base64.b64decode(mwc.webhooks[0].client_config.ca_bundle or "")


async def test_first_run_creates_a_ca_and_serving_pair_the_api_server_trusts(kube, kube_api, tmp_path):
    await install(kube)
    summary = await ensure_certs(api=kube, settings=SETTINGS, now=NOW)
    assert "CA created (missing)" in summary and "caBundle" in summary
    tls, data = await secret(kube, "nezha-webhook-tls")
    assert tls.type == "kubernetes.io/tls" and set(data) == {"tls.crt", "tls.key", "ca.crt"}
    assert await ca_bundle(kube) == data["ca.crt"]

    # The minted pair serves the webhook; the double reaches it by Service name and verifies it with caBundle.
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    (tmp_path / "tls.key").write_bytes(data["tls.key"])
    (tmp_path / "rules.yaml").write_text(RULES)
    port = free_port()
    hook = build_webhook(WebhookSettings(listen=f"127.0.0.1:{port}", tls_cert=tmp_path / "tls.crt",
                                         tls_key=tmp_path / "tls.key", rules=tmp_path / "rules.yaml",
                                         cache_ip="10.96.0.10"))
    runner = await start(hook)
    try:
        kube_api.service_addresses[("nezha", "nezha-webhook", 443)] = f"127.0.0.1:{port}"
        stored = await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
        assert stored.spec.host_aliases[0].ip == "10.106.122.174"
        assert [c.outcome for c in kube_api.admission_calls] == ["patched"]
    finally:
        await runner.cleanup()


async def test_a_second_run_with_valid_certificates_writes_nothing(kube, kube_api):
    await install(kube)
    await ensure_certs(api=kube, settings=SETTINGS, now=NOW)
    before = kube_api.rv
    assert await ensure_certs(api=kube, settings=SETTINGS, now=NOW + dt.timedelta(days=10)) == \
        "certificates valid; nothing to do"
    assert kube_api.rv == before


async def test_the_serving_certificate_is_renewed_within_renew_days_of_expiry_and_the_ca_kept(kube_api, kube):
    await install(kube)
    await ensure_certs(api=kube, settings=SETTINGS, now=NOW)
    _, old = await secret(kube, "nezha-webhook-tls")
    bundle = await ca_bundle(kube)
    later = NOW + dt.timedelta(days=61)  # 90-day certificate, 29 days left
    summary = await ensure_certs(api=kube, settings=SETTINGS, now=later)
    assert "serving certificate issued" in summary and "within 30 days" in summary and "CA" not in summary
    _, new = await secret(kube, "nezha-webhook-tls")
    renewed = Pair.load(new["tls.crt"], new["tls.key"])
    assert new["tls.crt"] != old["tls.crt"] and new["ca.crt"] == old["ca.crt"]
    assert renewed.cert.not_valid_after_utc > later + dt.timedelta(days=89)
    assert await ca_bundle(kube) == bundle


async def test_a_rotated_ca_keeps_the_previous_one_in_the_bundle_while_it_is_valid(kube_api, kube):
    await install(kube)
    await ensure_certs(api=kube, settings=SETTINGS, now=NOW)
    _, first = await secret(kube, "nezha-webhook-tls")
    near_ca_expiry = NOW + dt.timedelta(days=3650 - 20)
    summary = await ensure_certs(api=kube, settings=SETTINGS, now=near_ca_expiry)
    assert summary.startswith("CA created (expires")
    _, second = await secret(kube, "nezha-webhook-tls")
    assert second["ca.crt"] != first["ca.crt"]
    assert await ca_bundle(kube) == second["ca.crt"] + first["ca.crt"]


async def test_a_missing_webhook_configuration_is_named(kube_api, kube):
    await namespace(kube, "nezha")
    with pytest.raises(ConfigError, match="MutatingWebhookConfiguration nezha-webhook not found"):
        await ensure_certs(api=kube, settings=SETTINGS, now=NOW)


async def test_the_command_runs_against_a_kubeconfig(kube, kube_api, tmp_path):
    await install(kube)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nezha", "webhook", "certs", "--namespace", "nezha",
        "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", kube_api.url)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "serving certificate issued for nezha-webhook.nezha.svc" in out.decode()
    assert (await ca_bundle(kube)).startswith(b"-----BEGIN CERTIFICATE-----")
