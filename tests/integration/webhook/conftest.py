"""A real webhook over TLS: trustme CA, certificate files, a rules file, short reload intervals."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest
import trustme

from nezha.config import WebhookSettings
from testkit.ports import free_port
from webhook.server import build_webhook, start

RULES = """\
- name: dataset
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases:
    - ip: "10.106.122.174"
      hostnames: [download.tensorflow.org, www.cs.toronto.edu]
"""


class TLSFiles:
    def __init__(self, ca: trustme.CA, directory: Path) -> None:
        self.ca = ca
        self.cert = directory / "tls.crt"
        self.key = directory / "tls.key"
        self.issue()

    def issue(self, ca: trustme.CA | None = None) -> trustme.LeafCert:
        leaf = (ca or self.ca).issue_cert("127.0.0.1", "localhost", "nezha-webhook.nezha.svc")
        leaf.private_key_pem.write_to_path(str(self.key))
        with open(self.cert, "wb") as f:
            for blob in leaf.cert_chain_pems:
                f.write(blob.bytes())
        return leaf

    def client_context(self, ca: trustme.CA | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        (ca or self.ca).configure_trust(ctx)
        return ctx


@pytest.fixture
def tls(tmp_path: Path) -> TLSFiles:
    return TLSFiles(trustme.CA(), tmp_path)


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


@pytest.fixture
async def webhook(tls: TLSFiles, rules_file: Path):
    settings = WebhookSettings(listen=f"127.0.0.1:{free_port()}", tls_cert=tls.cert, tls_key=tls.key,
                               rules=rules_file, cache_ip="10.96.0.10", max_body_bytes=64 * 1024,
                               rules_reload_interval=0.05, tls_reload_interval=0.05, watch_service=False)
    hook = build_webhook(settings)
    runner = await start(hook)
    hook.url = f"https://127.0.0.1:{settings.listen_addr[1]}"  # type: ignore[attr-defined]
    try:
        yield hook
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(tls: TLSFiles):
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as session:
        yield session


from testkit.kubeapi.fixtures import kube, kube_api, kube_target  # noqa: E402,F401  (fixtures)
