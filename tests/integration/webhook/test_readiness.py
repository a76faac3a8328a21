"""/readyz: a webhook pod is ready only when an admitted pod would get its aliases."""

from __future__ import annotations

from testkit.ports import free_port
from nezha.config import WebhookSettings
from webhook.server import build_webhook, start

NEEDS_IP = """\
- name: dataset
  app: team
  label: ml
  hostAliases:
    - hostnames: [www.cs.toronto.edu]
"""


async def test_ready_only_once_the_cache_ip_a_rule_needs_is_known(tls, tmp_path, client):
    rules = tmp_path / "rules.yaml"
    rules.write_text(NEEDS_IP)
    settings = WebhookSettings(listen=f"127.0.0.1:{free_port()}", tls_cert=tls.cert, tls_key=tls.key,
                               rules=rules, watch_service=False)
    hook = build_webhook(settings)
    runner = await start(hook)
    url = f"https://127.0.0.1:{settings.listen_addr[1]}"
    try:
        async with client.get(url + "/readyz") as r:
            body = await r.json()
            assert r.status == 503 and "need the cache Service's IP" in body["why"]
        async with client.get(url + "/healthz") as r:
            assert r.status == 200  # alive all the same: a restart would not help
        hook.cache_ip = "10.96.0.10"  # what the Service watch sets
        async with client.get(url + "/readyz") as r:
            assert r.status == 200 and (await r.json())["ready"] is True
    finally:
        await runner.cleanup()


async def test_a_webhook_whose_rules_name_their_ip_is_ready_at_once(webhook, client):
    async with client.get(webhook.url + "/readyz") as r:
        assert r.status == 200
