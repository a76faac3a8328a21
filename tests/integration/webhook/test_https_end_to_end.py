"""Issue 13 the whole way: unmodified HTTPS clients in labelled pods download through the cache.

API double (in process) with the CA made by `nezha ca init` (its key in
Secret nezha-ca-key, its bundle in ConfigMap nezha-ca, copied into the
job's namespace by the controller's publisher) -> `nezha webhook`
with a `tls: true` rule -> each Job's pod stored with hostAliases to
127.0.0.2, the nezha-ca volume mounted and the clients' variables set ->
`nezha cache` on 127.0.0.2:80 and :443 with that CA -> the pod's own
command (Debian's curl and wget, Python requests), run in a mount namespace
whose /etc/hosts is built from the stored hostAliases and whose
/etc/nezha/ca holds the ConfigMap's files, with the container's variables.
The origin is a local HTTPS server whose certificate only the node
trusts; the clients trust only what the webhook gave them.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl
import sys
from pathlib import Path

import pytest
import trustme
import yaml
from aiohttp import web
from kubernetes_asyncio import client

from controller.trust import TrustPublisher
from nezha.ca_cli import init_in_cluster
from testkit.ports import free_port
from testkit.tools import require_tool
from testkit.waits import until_port
from tests.integration.webhook.registration import namespace, register
from tests.integration.webhook.test_end_to_end import knows_cache_ip, spawn, spawn_webhook, stop
from tests.pod_command import container_env, cover_for_hosts, mount_point, run_pod_command

HOST = "storage.googleapis.com"
S3 = "s3.amazonaws.com"  # boto3 reaches bucket `datasets` path-style through it: the same path
PATH = "/datasets/shard-00.tar"
URL = f"https://{HOST}{PATH}"
RULES = f"""\
- name: secure-datasets
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  tls: true
  hostAliases:
    - hostnames: [{HOST}, {S3}]
"""
CLIENTS = {
    "curl": ["curl", "-sS", "--fail", "-o", "shard-00.tar", URL],
    "wget": ["wget", "-q", URL],
    "requests": [sys.executable, "-c", "import requests; r = requests.get(%r, timeout=30); r.raise_for_status(); "
                                       "open('shard-00.tar', 'wb').write(r.content)" % URL],
    # A public dataset read the usual way: unsigned (a signed request is private, and passes the cache).
    "boto3": [sys.executable, "-c", "import boto3, botocore; from botocore.config import Config; "
                                    "s3 = boto3.client('s3', config=Config(signature_version=botocore.UNSIGNED)); "
                                    "open('shard-00.tar', 'wb').write(s3.get_object(Bucket='datasets', "
                                    "Key='shard-00.tar')['Body'].read())"],
}


class HttpsOrigin:
    def __init__(self, ca: trustme.CA, payload: bytes) -> None:
        self.ca, self.payload = ca, payload
        self.gets = 0

    async def start(self, aiohttp_server) -> int:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(ctx)
        app = web.Application()
        app.router.add_get(PATH, self.get)
        return (await aiohttp_server(app, host="127.0.0.1", ssl=ctx)).port

    async def get(self, request: web.Request) -> web.Response:
        self.gets += 1
        return web.Response(body=self.payload, headers={"ETag": '"shard-00"', "Cache-Control": "max-age=600"})


def labelled_job(name: str, command: list[str]) -> dict:
    container = {"name": "fetch", "image": "debian:12", "command": command,
                 "env": [{"name": "AWS_DEFAULT_REGION", "value": "us-east-1"}]}  # the job's own, as S3 users set
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"template": {
                "metadata": {"labels": {"app.kubernetes.io/deploy-manager": "ksonnet"}},
                "spec": {"restartPolicy": "Never", "containers": [container]}}}}


async def test_unmodified_https_clients_in_labelled_pods_download_through_the_cache(
        tmp_path, aiohttp_server, kube, kube_api, tls, request):
    for tool in ("curl", "wget", "unshare"):
        require_tool(tool)
    payload = os.urandom(2 * 1024 * 1024 + 5)
    public_ca = trustme.CA()  # the origin's issuer: stands in for the public roots, known to the node only
    origin = HttpsOrigin(public_ca, payload)
    origin_port = await origin.start(aiohttp_server)
    for port in (80, 443):
        with socket.socket() as s:  # nothing else may listen there (TIME_WAIT of an earlier run is fine)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.2", port))
    machine_hosts = cover_for_hosts(request)
    assert HOST not in machine_hosts.read_text()
    ca_dir = mount_point(request, Path("/etc/nezha/ca"))

    core = client.CoreV1Api(kube)
    await namespace(kube, "nezha")
    await namespace(kube, "ml")
    # The CA, as the chart's Job makes it.
    await init_in_cluster(kube, "nezha")
    secret = await core.read_namespaced_secret("nezha-ca-key", "nezha")
    node_ca = tmp_path / "node-ca"
    node_ca.mkdir()
    for name in ("ca.crt", "ca.key"):
        (node_ca / name).write_bytes(base64.b64decode(secret.data[name]))
    # The pods' copy of ConfigMap nezha-ca lives in their own namespace (a volume can only name one
    # there): the controller's publisher (`--publish-ca`) keeps it.
    publisher = TrustPublisher(api=kube, namespace="nezha", leading=lambda: True)
    publishing = asyncio.get_running_loop().create_task(publisher.run())

    public_bundle = tmp_path / "public-roots.pem"
    public_ca.cert_pem.write_to_path(str(public_bundle))
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"origins": [
        {"host": host, "upstream": f"https://127.0.0.1:{origin_port}", "ca_bundle": str(public_bundle)}
        for host in (HOST, S3)]}))
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    hook_port = free_port()
    processes = []
    try:
        cache_log, hook_log = tmp_path / "cache.log", tmp_path / "webhook.log"
        cache = await spawn(sys.executable, "-m", "nezha", "cache", "--listen", "127.0.0.2:80",
                            "--tls-listen", "127.0.0.2:443", "--ca-cert", str(node_ca / "ca.crt"),
                            "--ca-key", str(node_ca / "ca.key"), "--data-dir", str(tmp_path / "cache"),
                            "--config", str(config), log=cache_log)
        processes.append(cache)
        hook = await spawn_webhook(hook_port, tls=tls, rules=rules, api_url=kube_api.url, folder=tmp_path,
                                   log=hook_log)
        processes.append(hook)
        await core.create_namespaced_service("nezha", {"metadata": {"name": "nezha-cache"}, "spec": {
            "clusterIP": "127.0.0.2", "ports": [{"port": 80}, {"name": "https", "port": 443}],
            "selector": {"app": "nezha-cache"}}})
        await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"https://127.0.0.1:{hook_port}/mutate")
        await until_port("127.0.0.2", 443, timeout=20, proc=cache, log=cache_log, what="nezha cache")
        await until_port("127.0.0.1", hook_port, timeout=20, proc=hook, log=hook_log, what="nezha webhook")
        await knows_cache_ip(hook_port, tls, "127.0.0.2", hook_log)

        batch = client.BatchV1Api(kube)
        for name, command in CLIENTS.items():
            await batch.create_namespaced_job("ml", labelled_job(f"train-{name}", command))
        pods = []
        for _ in range(200):
            pods = (await core.list_namespaced_pod("ml")).items
            if len(pods) == len(CLIENTS):
                break
            await asyncio.sleep(0.02)
        assert len(pods) == len(CLIENTS), kube_api.job_errors

        files = tmp_path / "nezha-ca-volume"  # what kubelet would put in the pod's nezha-ca volume
        files.mkdir()
        for _ in range(200):
            if publisher.written:
                break
            await asyncio.sleep(0.02)
        for key, value in (await core.read_namespaced_config_map("nezha-ca", "ml")).data.items():
            (files / key).write_text(value)
        for p in sorted(pods, key=lambda p: p.metadata.name):
            raw = kube.sanitize_for_serialization(p)
            spec = raw["spec"]
            assert spec["hostAliases"] == [{"ip": "127.0.0.2", "hostnames": [HOST, S3]}]
            assert container_env(raw)["AWS_ENDPOINT_URL_S3"] == f"https://{S3}"
            assert {"name": "nezha-ca", "configMap": {"name": "nezha-ca"}} in spec["volumes"]
            assert spec["containers"][0]["volumeMounts"] == [
                {"name": "nezha-ca", "mountPath": "/etc/nezha/ca", "readOnly": True}]
            workdir = tmp_path / raw["metadata"]["name"]
            await run_pod_command(raw, workdir, timeout=60, env=container_env(raw),
                                  mounts={str(ca_dir): files},
                                  context=f"cache log: {cache_log.read_text()[-3000:]}")
            assert (workdir / "shard-00.tar").read_bytes() == payload, raw["metadata"]["name"]
        assert origin.gets == 2  # four programs, two names (two keys), one fetch each: the rest were hits
        served = cache_log.read_text()  # (identical hit lines collapse into one: nezha/logs.py)
        assert '"cache": "hit"' in served and "Traceback" not in served and "WARNING" not in served, served[-3000:]
        assert HOST not in machine_hosts.read_text()
    finally:
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
        for p in processes:
            await stop(p)


@pytest.fixture(autouse=True)
def _no_proxy_from_the_machine(monkeypatch):
    for name in list(os.environ):
        if "proxy" in name.lower():
            monkeypatch.delenv(name)
