"""The whole way with real programs: a labelled Job's pods download through the cache.

API double (in process) -> `nezha webhook` (a process that learns the cache
Service IP from the double) -> the Job's pods are stored with hostAliases to
127.0.0.2 -> `nezha cache` (a process on 127.0.0.2:80) -> the pods' own
`wget`, run in a mount namespace whose /etc/hosts is built from the stored
hostAliases the way kubelet writes it. The origin sees one request for two pods.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import aiohttp
from kubernetes_asyncio import client

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.ports import free_port
from testkit.tools import require_tool
from testkit.waits import until_port
from tests.integration.webhook.registration import namespace, register
from tests.integration.webhook.reviews import job
from tests.pod_command import cover_for_hosts, run_pod_command
from tests.support_origin import TestOrigin

URL_PATH = "/~kriz/cifar-100-python.tar.gz"
RULES = """\
- name: datasets
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases:
    - hostnames: [download.tensorflow.org, www.cs.toronto.edu, images.cocodataset.org]
"""


async def spawn(*args: str, log: Path) -> asyncio.subprocess.Process:
    out = open(log, "wb")
    try:
        return await asyncio.create_subprocess_exec(*args, stdout=out, stderr=asyncio.subprocess.STDOUT)
    finally:
        out.close()


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


async def spawn_webhook(port: int, *, tls, rules: Path, api_url: str, folder: Path,
                        log: Path) -> asyncio.subprocess.Process:
    """`nezha webhook` as the chart runs it, pointed at the API double, learning the cache IP from it."""
    return await spawn(sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{port}",
                       "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--rules", str(rules),
                       "--kubeconfig", str(kubeconfig(folder / "kubeconfig", api_url)),
                       "--namespace", "nezha", "--cache-service", "nezha-cache", log=log)


async def knows_cache_ip(hook_port: int, tls, ip: str, log: Path) -> None:
    """Wait until the webhook has learned the cache Service's IP from its watch."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as c:
        for _ in range(200):
            async with c.get(f"https://127.0.0.1:{hook_port}/healthz") as r:
                if (await r.json())["cache_ip"] == ip:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"webhook never learned the cache IP: {log.read_text()[-2000:]}")


async def test_two_labelled_job_pods_download_through_the_cache_with_one_origin_request(
        tmp_path, aiohttp_server, kube, kube_api, tls, request):
    require_tool("wget"), require_tool("unshare")
    payload = os.urandom(300_000)
    origin = TestOrigin()
    origin.put(URL_PATH, payload)
    origin_server = await aiohttp_server(origin.app())
    with socket.socket() as s:  # nothing else may listen on 127.0.0.2:80 (TIME_WAIT of an earlier run is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.2", 80))
    machine_hosts = cover_for_hosts(request)
    assert "www.cs.toronto.edu" not in machine_hosts.read_text()  # else hostAliases would prove nothing

    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    hook_port = free_port()
    processes = []
    try:
        cache_log, hook_log = tmp_path / "cache.log", tmp_path / "webhook.log"
        cache = await spawn(sys.executable, "-m", "nezha", "cache", "--listen", "127.0.0.2:80",
                            "--data-dir", str(tmp_path / "cache"),
                            "--origin", f"www.cs.toronto.edu=http://127.0.0.1:{origin_server.port}", log=cache_log)
        processes.append(cache)
        hook = await spawn_webhook(hook_port, tls=tls, rules=rules, api_url=kube_api.url, folder=tmp_path,
                                   log=hook_log)
        processes.append(hook)

        core = client.CoreV1Api(kube)
        await namespace(kube, "nezha")
        await namespace(kube, "ml")
        await core.create_namespaced_service("nezha", {"metadata": {"name": "nezha-cache"}, "spec": {
            "clusterIP": "127.0.0.2", "ports": [{"port": 80}], "selector": {"app": "nezha-cache"}}})
        await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"https://127.0.0.1:{hook_port}/mutate")
        await until_port("127.0.0.2", 80, timeout=20, proc=cache, log=cache_log, what="nezha cache")
        await until_port("127.0.0.1", hook_port, timeout=20, proc=hook, log=hook_log, what="nezha webhook")
        await knows_cache_ip(hook_port, tls, "127.0.0.2", hook_log)

        batch = client.BatchV1Api(kube)
        for name in ("train-a", "train-b"):
            j = job()
            j["metadata"]["name"] = name
            await batch.create_namespaced_job("ml", j)
        pods = []
        for _ in range(200):
            pods = (await core.list_namespaced_pod("ml")).items
            if len(pods) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(pods) == 2, kube_api.job_errors

        for p in pods:
            raw = kube.sanitize_for_serialization(p)
            assert raw["spec"]["hostAliases"] == [{"ip": "127.0.0.2", "hostnames": [
                "download.tensorflow.org", "www.cs.toronto.edu", "images.cocodataset.org"]}]
            workdir = tmp_path / raw["metadata"]["name"]
            assert raw["spec"]["containers"][0]["command"][0] == "wget"
            await run_pod_command(raw, workdir, options=("-q",), timeout=30,
                                  context=f"cache log: {cache_log.read_text()[-3000:]}")
            assert (workdir / "cifar-100-python.tar.gz").read_bytes() == payload
        assert origin.requests[URL_PATH] == 1
        assert "www.cs.toronto.edu" not in machine_hosts.read_text()  # only the pods' namespaces saw it
    finally:
        for p in processes:
            await stop(p)
