"""`nezha webhook` as a process: serves over TLS from files; bad files stop it with a named reason."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp

from tests.conftest import free_port
from tests.integration.webhook.reviews import patched, pod, review


async def test_nezha_webhook_serves_reviews_from_files(tls, rules_file):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{port}",
                             "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--rules", str(rules_file),
                             "--cache-ip", "10.96.0.10"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as c:
            deadline = time.monotonic() + 15
            while True:
                try:
                    async with c.get(f"https://127.0.0.1:{port}/healthz") as r:
                        assert r.status == 200
                        break
                except aiohttp.ClientConnectorError:
                    assert proc.poll() is None, proc.stderr.read().decode()
                    assert time.monotonic() < deadline, "webhook did not listen within 15 s"
                    await asyncio.sleep(0.1)
            obj = pod()
            async with c.post(f"https://127.0.0.1:{port}/mutate", json=review(obj)) as r:
                assert patched(obj, await r.json())["spec"]["hostAliases"][0]["ip"] == "10.106.122.174"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    events = [json.loads(line)["event"] for line in out.decode().splitlines()]
    assert "webhook_listening" in events and "review_completed" in events


def test_a_rules_file_that_does_not_parse_stops_start_up_naming_it(tls, tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("- {name: r, app: k, label: v, hostAliases: [{ip: nope, hostnames: [a.b]}]}\n")
    proc = subprocess.run([sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{free_port()}",
                           "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--rules", str(bad),
                           "--cache-ip", "10.96.0.10"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert f"rules file {bad}: rule 'r': hostAliases[0].ip is not an IP address: 'nope'" in proc.stderr


def test_without_cache_ip_or_cluster_access_the_command_says_what_to_pass(tls, rules_file):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "NEZHA_"))}
    proc = subprocess.run([sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{free_port()}",
                           "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--rules", str(rules_file)],
                          capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach the Kubernetes API through the in-cluster service account" in proc.stderr
    assert "--cache-ip" in proc.stderr
