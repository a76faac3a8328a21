"""Issue 23: a sidecar whose parent is down reaches the real origin although its pod's /etc/hosts names itself.

In a training pod the webhook maps every dataset host to the sidecar
(hostAliases), and the sidecar shares that /etc/hosts. The node runs here
in a mount namespace whose /etc/hosts maps the origin's name to 127.0.0.2,
where nothing listens (the sidecar's address in a pod); a nameserver on
127.0.0.1 (this test's) gives the real address. With a parent, the node
asks the nameserver (`origin_resolver` unset: `dns`), and the fallback
reaches the origin; told to resolve the system's way, it reaches
127.0.0.2 and fails, which is the fault the resolver exists for.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.nameserver import serving
from testkit.ports import free_port
from testkit.tools import require_tool
from testkit.waits import until_http
from tests.pod_command import cover_for_hosts

NAME = "dataset.test"


@pytest.fixture
async def nameserver():
    async with serving({NAME: "127.0.0.1"}) as server:
        yield server


@pytest.fixture
def pod_node(request, tmp_path):
    """`nezha cache` in a mount namespace whose /etc/hosts maps NAME to 127.0.0.2, as a pod's does to its sidecar."""
    cover_for_hosts(request)
    unshare = require_tool("unshare")
    started: list[subprocess.Popen] = []

    async def start(settings: dict, session) -> tuple[str, Path]:
        port = free_port()
        folder = tmp_path / f"pod-{port}"
        folder.mkdir()
        (folder / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.0.2\t{NAME}\n")
        (folder / "node.yaml").write_text(yaml.safe_dump(settings))
        node = [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}",
                "--data-dir", str(folder / "data"), "--config", str(folder / "node.yaml")]
        script = f"mount --bind {shlex.quote(str(folder / 'hosts'))} /etc/hosts && exec {shlex.join(node)}"
        log = folder / "node.out"
        with open(log, "wb") as out:
            proc = subprocess.Popen([unshare, "-m", "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
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
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def settings(origin, nameserver, **more) -> dict:
    return {"origins": [{"host": NAME, "upstream": f"http://{NAME}:{origin.url.rsplit(':', 1)[1]}"}],
            "parent": f"http://127.0.0.1:{free_port()}",  # down
            "origin_nameservers": [f"127.0.0.1:{nameserver.port}"], **more}


async def test_with_its_parent_down_a_sidecar_finds_the_origin_by_nameserver_not_by_its_pods_hosts_file(
        pod_node, origin, nameserver, session):
    origin.put("/data.bin", b"the real origin's bytes")
    url, log = await pod_node(settings(origin, nameserver), session)
    async with session.get(url + "/data.bin", headers={"Host": NAME}) as r:
        assert (r.status, await r.read()) == (200, b"the real origin's bytes")
    assert origin.requests["/data.bin"] == 1
    assert (NAME, 1) in nameserver.asked
    assert [e["reason"] for e in events(log) if e["event"] == "parent_fallback"] == ["unreachable"]


async def test_resolved_the_systems_way_the_same_sidecar_meets_its_hosts_file_and_fails(
        pod_node, origin, nameserver, session):
    origin.put("/data.bin", b"the real origin's bytes")
    url, _ = await pod_node(settings(origin, nameserver, origin_resolver="system"), session)
    async with session.get(url + "/data.bin", headers={"Host": NAME}) as r:
        assert r.status == 502
        assert "cannot connect" in await r.text()
    assert origin.requests["/data.bin"] == 0
    assert nameserver.asked == []


async def test_a_name_no_nameserver_knows_is_a_502_naming_the_nameservers(pod_node, origin, nameserver, session):
    url, _ = await pod_node({**settings(origin, nameserver),
                             "origins": [{"host": "unknown.test", "upstream": "http://unknown.test"}]}, session)
    async with session.get(url + "/x", headers={"Host": "unknown.test"}) as r:
        assert r.status == 502
        text = await r.text()
    assert "no address from the nameservers" in text and f"127.0.0.1:{nameserver.port}" in text
    assert ("unknown.test", 1) in nameserver.asked
