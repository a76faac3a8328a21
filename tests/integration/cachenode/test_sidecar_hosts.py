"""A sidecar whose parent is down reaches the real origin although its pod's /etc/hosts names itself.

In a training pod the webhook maps every dataset host to the sidecar
(hostAliases), and the kubelet writes those aliases into the /etc/hosts of
every container that does not mount one itself. The webhook gives the
sidecar an /etc/hosts of its own (webhook/sidecar.py, HOSTS_FILE: localhost
only), so the node resolves origin names the system's way and they come
from DNS. Each node here runs in a mount namespace whose /etc/resolv.conf
names this test's nameserver and whose /etc/hosts is either the sidecar's
own file or the pod's (NAME aliased to 127.0.0.2, where nothing listens:
the sidecar's address in a pod). With its own file the fallback, plain and
TLS, reaches the origin; with the pod's it reaches 127.0.0.2 and fails,
which is the fault the mount exists for.
"""

from __future__ import annotations

import asyncio
import errno
import random
import shlex
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.nameserver import serving
from testkit.ports import free_port
from testkit.tools import require_tool
from testkit.waits import until_http
from tests.integration.cachenode.conftest import until
from tests.pod_command import cover_for_hosts
from testkit.logs import log_events
from webhook.sidecar import HOSTS_FILE

NAME = "dataset.test"
PODS_HOSTS = f"127.0.0.1\tlocalhost\n127.0.0.2\t{NAME}\n"  # as the kubelet writes the pod's hostAliases


@pytest.fixture
async def nameserver():
    """The pod's nameserver on port 53 (resolv.conf names no port) of an address of 127.53.0.0/16 of its own."""
    for _ in range(20):
        try:
            async with serving({NAME: "127.0.0.1"}, host=f"127.53.{random.randrange(256)}.{random.randrange(1, 255)}",
                               port=53) as server:
                server.host = server.transport.get_extra_info("sockname")[0]
                yield server
                return
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    raise RuntimeError("no free 127.53.x.y:53 for the test nameserver")


@pytest.fixture
def pod_node(request, tmp_path, nameserver):
    """`nezha cache` in a mount namespace with the given /etc/hosts and a resolv.conf naming `nameserver`."""
    cover_for_hosts(request)
    unshare = require_tool("unshare")
    started: list[subprocess.Popen] = []

    async def start(settings: dict, session, *, hosts: str, tls_port: int | None = None,
                    port: int | None = None) -> tuple[str, Path]:
        port = port or free_port()
        folder = tmp_path / f"pod-{port}"
        folder.mkdir()
        (folder / "hosts").write_text(hosts)
        (folder / "resolv.conf").write_text(f"nameserver {nameserver.host}\noptions timeout:1 attempts:1\n")
        (folder / "node.yaml").write_text(yaml.safe_dump(settings))
        node = [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}",
                "--data-dir", str(folder / "data"), "--config", str(folder / "node.yaml")]
        if tls_port is not None:
            node += ["--tls-listen", f"127.0.0.1:{tls_port}"]
        script = (f"mount --bind {shlex.quote(str(folder / 'hosts'))} /etc/hosts && "
                  f"mount --bind {shlex.quote(str(folder / 'resolv.conf'))} /etc/resolv.conf && "
                  f"exec {shlex.join(node)}")
        log = folder / "node.out"
        with open(log, "wb") as out:
            proc = subprocess.Popen([unshare, "-m", "--propagation", "private", "sh", "-c", script], stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        await until_http(f"http://127.0.0.1:{port}/healthz", timeout=15, proc=proc, log=log, what="nezha cache",
                         session=session)
        return f"http://127.0.0.1:{port}", log

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def events(log: Path) -> list[dict]:
    return log_events(log)


def settings(upstream_port: int, **more) -> dict:
    return {"origins": [{"host": NAME, "upstream": f"http://{NAME}:{upstream_port}"}],
            "parent": f"http://127.0.0.1:{free_port()}", **more}  # the parent is down


def origin_port(origin) -> int:
    return int(origin.url.rsplit(":", 1)[1])


async def test_with_its_parent_down_a_sidecar_with_its_own_hosts_file_finds_the_origin_by_dns(
        pod_node, origin, nameserver, session):
    origin.put("/data.bin", b"the real origin's bytes")
    url, log = await pod_node(settings(origin_port(origin)), session, hosts=HOSTS_FILE)
    async with session.get(url + "/data.bin", headers={"Host": NAME}) as r:
        assert (r.status, await r.read()) == (200, b"the real origin's bytes")
    assert origin.requests["/data.bin"] == 1
    assert (NAME, 1) in nameserver.asked
    assert [e["reason"] for e in events(log) if e["event"] == "parent_fallback"] == ["unreachable"]


async def test_reading_the_pods_hosts_file_the_same_sidecar_meets_its_aliases_and_fails(
        pod_node, origin, nameserver, session):
    origin.put("/data.bin", b"the real origin's bytes")
    url, _ = await pod_node(settings(origin_port(origin)), session, hosts=PODS_HOSTS)
    async with session.get(url + "/data.bin", headers={"Host": NAME}) as r:
        assert r.status == 502
        assert "cannot connect" in await r.text()
    assert origin.requests["/data.bin"] == 0
    assert nameserver.asked == []


async def test_a_name_no_nameserver_knows_is_a_502_naming_the_name(pod_node, origin, nameserver, session):
    url, _ = await pod_node({**settings(origin_port(origin)),
                             "origins": [{"host": "unknown.test", "upstream": "http://unknown.test"}]},
                            session, hosts=HOSTS_FILE)
    async with session.get(url + "/x", headers={"Host": "unknown.test"}) as r:
        assert r.status == 502
        text = await r.text()
    assert "unknown.test" in text
    assert ("unknown.test", 1) in nameserver.asked


async def test_a_sidecar_whose_origin_name_resolves_to_itself_answers_508_instead_of_waiting_on_itself(
        pod_node, nameserver, session):
    """A sidecar that reads the pod's /etc/hosts (one not given an /etc/hosts
    of its own) finds the origin's name aliased to itself: with the parent
    down, its request "to the origin" comes back to it. That loop is named at
    once (508), not joined to the fill that waits for it."""
    port = free_port()
    url, log = await pod_node({"origins": [{"host": "loop.test", "upstream": f"http://loop.test:{port}"}],
                               "parent": f"http://127.0.0.1:{free_port()}", "node_id": "sidecar"},
                              session, hosts="127.0.0.1\tlocalhost\n127.0.0.1\tloop.test\n", port=port)
    async with session.get(url + "/data.bin", headers={"Host": "loop.test"}) as r:
        body = await r.text()
        assert r.status == 508
    assert "resolves back to this node" in body
    found = events(log)
    assert [e["reason"] for e in found if e["event"] == "parent_fallback"] == ["unreachable"]
    assert [e["event"] for e in found if e["event"] == "request_looped"] == ["request_looped"]
    assert nameserver.asked == []  # the pod's /etc/hosts answered


@pytest.mark.parametrize("hosts, reaches_origin", [(HOSTS_FILE, True), (PODS_HOSTS, False)],
                         ids=["own-hosts-file", "pods-hosts-file"])
async def test_with_its_parents_tls_port_down_the_sidecar_passes_tls_to_the_origin_only_through_its_own_hosts_file(
        pod_node, nameserver, session, hosts, reaches_origin):
    """The TLS port's fallback connects to the origin's name as the HTTP fallback does: the
    bytes of the ClientHello arrive at the origin's address only when /etc/hosts is the sidecar's own."""
    hellos: list[bytes] = []

    async def origin_443(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await reader.read(5))  # a TLS record's header; then hang up, as a refusing server would
        writer.close()

    server = await asyncio.start_server(origin_443, "127.0.0.1", 0)
    try:
        upstream_port = server.sockets[0].getsockname()[1]
        tls_port = free_port()
        config = {"origins": [{"host": NAME, "upstream": f"https://{NAME}:{upstream_port}", "tls": "passthrough"}],
                  "parent": f"http://127.0.0.1:{free_port()}", "parent_tls_port": free_port()}
        _, log = await pod_node(config, session, hosts=hosts, tls_port=tls_port)
        context = ssl.create_default_context()
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", tls_port, ssl=context, server_hostname=NAME), 10)
            writer.close()
        await until(lambda: any(e["event"] in ("tls_relayed", "tls_relay_failed") for e in events(log)))
    finally:
        server.close()
        await server.wait_closed()
    assert [h[:1] for h in hellos] == ([b"\x16"] if reaches_origin else [])  # 0x16: a TLS handshake record
    relays = [e["event"] for e in events(log) if e["event"] in ("tls_relayed", "tls_relay_failed")]
    assert relays == (["tls_relayed"] if reaches_origin else ["tls_relay_failed"])
    assert ((NAME, 1) in nameserver.asked) is reaches_origin
