"""Register the shipped MutatingWebhookConfiguration with the API double, pointed at a test webhook."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import yaml
from kubernetes_asyncio import client

MANIFEST = Path(__file__).resolve().parents[3] / "webhook" / "manifests" / "mutatingwebhookconfiguration.yaml"


def configuration(*, ca_pem: bytes, url: str | None = None, **overrides) -> dict:
    """The manifest with caBundle set, and the webhook at `url` instead of the Service when given."""
    mwc = yaml.safe_load(MANIFEST.read_text())
    hook = mwc["webhooks"][0]
    hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
    if url is not None:
        hook["clientConfig"] = {"url": url, "caBundle": hook["clientConfig"]["caBundle"]}
    hook.update(copy.deepcopy(overrides))
    return mwc


async def register(kube, **kw) -> dict:
    api = client.AdmissionregistrationV1Api(kube)
    await api.create_mutating_webhook_configuration(configuration(**kw))
    return kw


async def namespace(kube, name: str, labels: dict | None = None) -> None:
    await client.CoreV1Api(kube).create_namespace({"metadata": {"name": name, "labels": labels or {}}})
