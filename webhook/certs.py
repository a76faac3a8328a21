"""`nezha webhook certs`: the webhook's CA and serving certificate, kept in the cluster.

What the original Nezha's setup.sh did by hand, made idempotent so it can run
at install and then on a schedule:

- a CA (Secret `<tls_secret>-ca`, never mounted by the webhook) valid ten
  years, replaced when it gets within `renew_days` of expiry;
- a serving certificate for the webhook Service's DNS names, signed by that CA,
  in Secret `<tls_secret>` (type kubernetes.io/tls: tls.crt, tls.key, ca.crt),
  which the webhook pod mounts; reissued when missing, not signed by the
  current CA, missing a DNS name, or within `renew_days` of expiry. The
  running webhook re-reads the mounted files, so no restart is needed;
- `caBundle` of every webhook in the MutatingWebhookConfiguration: the current
  CA, plus the previous one while it is still valid, so a webhook still serving
  the old certificate keeps being trusted during a CA rotation.

A run that finds everything valid writes nothing.
"""

from __future__ import annotations

import base64
import datetime as dt

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nezha.config import WebhookSettings
from nezha.errors import ConfigError
from nezha.pki import Pair, make_ca, make_serving, renewal_reason  # noqa: F401  (Pair: tests load pairs)


def dns_names(settings: WebhookSettings) -> list[str]:
    svc, ns = settings.webhook_service, settings.namespace
    return [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _read_secret(core: client.CoreV1Api, name: str, namespace: str) -> client.V1Secret | None:
    try:
        return await core.read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _pair_from(secret: client.V1Secret | None, cert_key: str, key_key: str) -> Pair | None:
    data = (secret.data or {}) if secret is not None else {}
    if cert_key not in data or key_key not in data:
        return None
    try:
        return Pair.load(base64.b64decode(data[cert_key]), base64.b64decode(data[key_key]))
    except ValueError:
        return None


async def _write_secret(core: client.CoreV1Api, existing: client.V1Secret | None, *, name: str, namespace: str,
                        type_: str, data: dict[str, bytes]) -> None:
    body = {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "nezha", "app.kubernetes.io/component": "webhook"}},
            "data": {k: _b64(v) for k, v in data.items()}}
    if existing is None:
        await core.create_namespaced_secret(namespace, body)
    else:
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version
        await core.replace_namespaced_secret(name, namespace, body)


async def ensure_certs(*, api: client.ApiClient, settings: WebhookSettings, now: dt.datetime | None = None) -> str:
    """Create or renew what is due; returns one line saying what was done."""
    now = now or dt.datetime.now(dt.timezone.utc)
    core = client.CoreV1Api(api)
    ns, names = settings.namespace, dns_names(settings)
    ca_name = f"{settings.tls_secret}-ca"
    done: list[str] = []

    ca_secret = await _read_secret(core, ca_name, ns)
    ca = _pair_from(ca_secret, "tls.crt", "tls.key")
    previous_ca: Pair | None = None
    if (why := renewal_reason(ca, now=now, renew_days=settings.renew_days)) is not None:
        previous_ca = ca
        ca = make_ca(now=now)
        await _write_secret(core, ca_secret, name=ca_name, namespace=ns, type_="kubernetes.io/tls",
                            data={"tls.crt": ca.cert_pem, "tls.key": ca.key_pem})
        done.append(f"CA created ({why})")
    assert ca is not None

    tls_secret = await _read_secret(core, settings.tls_secret, ns)
    serving = _pair_from(tls_secret, "tls.crt", "tls.key")
    why = renewal_reason(serving, ca=ca, names=names, now=now, renew_days=settings.renew_days)
    if why is not None:
        serving = make_serving(ca, names=names, now=now, days=settings.cert_days)
        await _write_secret(core, tls_secret, name=settings.tls_secret, namespace=ns, type_="kubernetes.io/tls",
                            data={"tls.crt": serving.cert_pem, "tls.key": serving.key_pem, "ca.crt": ca.cert_pem})
        done.append(f"serving certificate issued for {names[2]} until "
                    f"{serving.cert.not_valid_after_utc:%Y-%m-%d} ({why})")

    bundle = ca.cert_pem
    if previous_ca is not None and previous_ca.cert.not_valid_after_utc > now:
        bundle += previous_ca.cert_pem
    if await _patch_ca_bundle(api, settings.webhook_configuration, _b64(bundle), keep_from=ca.cert_pem):
        done.append(f"caBundle of MutatingWebhookConfiguration {settings.webhook_configuration} updated")
    return "; ".join(done) if done else "certificates valid; nothing to do"


async def _patch_ca_bundle(api: client.ApiClient, name: str, bundle: str, *, keep_from: bytes) -> bool:
    reg = client.AdmissionregistrationV1Api(api)
    try:
        mwc = await reg.read_mutating_webhook_configuration(name)
    except ApiException as e:
        if e.status == 404:
            raise ConfigError(f"MutatingWebhookConfiguration {name} not found; apply "
                              "webhook/manifests/mutatingwebhookconfiguration.yaml (or the chart) first") from e
        raise
    ops = []
    for i, hook in enumerate(mwc.webhooks or []):
        current = hook.client_config.ca_bundle or ""
        # A bundle that already starts with the current CA is kept (it may still carry the previous one).
        if current and base64.b64decode(current).startswith(keep_from):
            continue
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle})
    if ops:
        await reg.patch_mutating_webhook_configuration(name, ops)
    return bool(ops)
