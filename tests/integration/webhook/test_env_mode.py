"""mode: env over TLS: NO_PROXY comes from the rule, else the setting, else the webhook's default."""

from __future__ import annotations

import pytest

from nezha.config import WebhookSettings
from testkit.ports import free_port
from tests.integration.webhook.reviews import patched, pod, review
from webhook.patch import DEFAULT_NO_PROXY
from webhook.server import build_webhook, start

RULES = """\
- name: proxy
  app: team
  label: vision
  mode: env
  hostAliases: [{ip: 10.106.122.174, hostnames: [www.cs.toronto.edu]}]
- name: proxy-own-list
  app: team
  label: speech
  mode: env
  noProxy: [.svc, .internal.example]
  hostAliases: [{ip: 10.106.122.174, hostnames: [www.cs.toronto.edu]}]
"""


@pytest.fixture
async def serve(tls, tmp_path):
    runners = []

    async def serve(**settings):
        rules = tmp_path / "env-rules.yaml"
        rules.write_text(RULES)
        hook = build_webhook(WebhookSettings(listen=f"127.0.0.1:{free_port()}", tls_cert=tls.cert,
                                             tls_key=tls.key, rules=rules, watch_service=False, **settings))
        runners.append(await start(hook))
        return f"https://127.0.0.1:{hook.settings.listen_addr[1]}"

    yield serve
    for runner in runners:
        await runner.cleanup()


async def env_of(client, url, team):
    obj = pod(labels={"team": team})
    async with client.post(f"{url}/mutate", json=review(obj)) as r:
        assert r.status == 200
        [container] = patched(obj, await r.json())["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.parametrize("settings,team,no_proxy", [
    ({}, "vision", DEFAULT_NO_PROXY),
    ({"no_proxy": "a.example,.svc"}, "vision", "a.example,.svc"),
    ({"no_proxy": "a.example,.svc"}, "speech", ".svc,.internal.example"),
], ids=["default", "setting", "rule-over-setting"])
async def test_no_proxy_comes_from_the_rule_else_the_setting_else_the_default(serve, client, settings, team,
                                                                                no_proxy):
    url = await serve(**settings)
    env = await env_of(client, url, team)
    assert env == {"HTTP_PROXY": "http://nezha-cache.nezha.svc:80", "http_proxy": "http://nezha-cache.nezha.svc:80",
                   "NO_PROXY": no_proxy, "no_proxy": no_proxy}
