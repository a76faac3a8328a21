"""`nezha webhook` as a process: serves over TLS from files; bad files stop it with a named reason."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
from kubernetes_asyncio import client

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.ports import free_port
from testkit.waits import until_http
from tests.integration.webhook.registration import namespace
from tests.integration.webhook.reviews import patched, pod, review
from testkit.logs import log_events


async def test_nezha_webhook_serves_reviews_from_files(tls, rules_file):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{port}",
                             "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--rules", str(rules_file),
                             "--cache-ip", "10.96.0.10"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as c:
            status, _ = await until_http(f"https://127.0.0.1:{port}/healthz", timeout=15, proc=proc,
                                         what="nezha webhook", status=None, session=c, interval=0.1)
            assert status == 200
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


RULE_WITHOUT_IP = """\
- name: cache
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases:
    - hostnames: [www.cs.toronto.edu]
"""
NO_CLUSTER = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "NEZHA_"))}


def test_without_cache_ip_or_cluster_access_a_rule_without_ip_stops_start_up_saying_what_to_pass(tls, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE_WITHOUT_IP)
    proc = subprocess.run([sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{free_port()}",
                           "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--rules", str(rules)],
                          capture_output=True, text=True, timeout=30, env=NO_CLUSTER)
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach the Kubernetes API through the in-cluster service account" in proc.stderr
    assert "--cache-ip" in proc.stderr


class Running:
    """`nezha webhook` as a process whose JSON log lines are read from a file while it runs."""

    def __init__(self, args, *, tls, log, env=None):
        self.port = free_port()
        self.log = log
        self.tls = tls
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "nezha", "webhook", "--listen",
                                          f"127.0.0.1:{self.port}", "--tls-cert", str(tls.cert), "--tls-key",
                                          str(tls.key), *args], stdout=out, stderr=subprocess.STDOUT,
                                         env={**(env or os.environ), "NEZHA_RULES_RELOAD_INTERVAL": "0.1"})
        self.url = f"https://127.0.0.1:{self.port}"

    def events(self):
        return log_events(self.log)

    async def healthz(self, session):
        _, body = await until_http(f"{self.url}/healthz", timeout=15, proc=self.proc, log=self.log,
                                   what="nezha webhook", status=None, session=session, interval=0.1)
        return json.loads(body)

    async def until(self, check, what, timeout=15.0):
        deadline = time.monotonic() + timeout
        while not await check():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, f"{what} within {timeout} s; log: {self.log.read_text()[-2000:]}"
            await asyncio.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def test_rules_that_all_name_an_ip_need_neither_cache_ip_nor_cluster_access(tls, rules_file, tmp_path):
    hook = Running(["--rules", str(rules_file)], tls=tls, log=tmp_path / "webhook.log", env=NO_CLUSTER)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as c:
            assert (await hook.healthz(c))["cache_ip"] is None
            obj = pod()
            async with c.post(f"{hook.url}/mutate", json=review(obj)) as r:
                assert patched(obj, await r.json())["spec"]["hostAliases"][0]["ip"] == "10.106.122.174"
    finally:
        hook.stop()
    assert "service_watch_starting" not in [e["event"] for e in hook.events()]


async def test_a_reloaded_rule_without_ip_starts_the_service_watch(tls, rules_file, tmp_path, kube, kube_api):
    await namespace(kube, "nezha")
    svc = await client.CoreV1Api(kube).create_namespaced_service("nezha", {
        "metadata": {"name": "nezha-cache"}, "spec": {"ports": [{"port": 80}]}})
    config = kubeconfig(tmp_path / "kubeconfig", kube_api.url)
    hook = Running(["--rules", str(rules_file), "--kubeconfig", str(config)], tls=tls, log=tmp_path / "webhook.log")
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as c:
            assert (await hook.healthz(c))["cache_ip"] is None
            await asyncio.sleep(0.5)  # several reload polls: still no reason to ask the API anything
            assert not [r for r in kube_api.requests if "/services" in r[1] and "nezha-cache" in r[1]]

            rules_file.write_text(RULE_WITHOUT_IP)

            async def learned():
                return (await hook.healthz(c))["cache_ip"] == svc.spec.cluster_ip

            await hook.until(learned, "the cache IP was not learned after the reload")
            obj = pod()
            async with c.post(f"{hook.url}/mutate", json=review(obj)) as r:
                assert patched(obj, await r.json())["spec"]["hostAliases"] == [
                    {"ip": svc.spec.cluster_ip, "hostnames": ["www.cs.toronto.edu"]}]
    finally:
        hook.stop()
    [started] = [e for e in hook.events() if e["event"] == "service_watch_starting"]
    assert started["rules"] == ["cache"]


async def test_a_reloaded_rule_without_ip_and_no_cluster_access_is_logged_naming_the_flags(tls, rules_file, tmp_path):
    hook = Running(["--rules", str(rules_file)], tls=tls, log=tmp_path / "webhook.log", env=NO_CLUSTER)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as c:
            await hook.healthz(c)
            rules_file.write_text(RULE_WITHOUT_IP)

            async def logged():
                return any(e["event"] == "service_watch_unavailable" for e in hook.events())

            await hook.until(logged, "no service_watch_unavailable line")
            obj = pod()
            async with c.post(f"{hook.url}/mutate", json=review(obj)) as r:
                answer = await r.json()
            assert patched(obj, answer).get("spec", {}).get("hostAliases") is None
            assert "cache Service IP is not known" in answer["response"]["warnings"][0]
    finally:
        hook.stop()
    [line] = [e for e in hook.events() if e["event"] == "service_watch_unavailable"]
    assert line["level"] == "error" and "--cache-ip" in line["error"] and "--kubeconfig" in line["error"]
