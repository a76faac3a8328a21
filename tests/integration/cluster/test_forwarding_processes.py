"""Forwarding between real node processes: Range requests and rings that disagree.

The in-process tests in tests/integration/cachenode/test_peers.py cover the
relay's corner cases; these prove the same promises hold for `nezha cache`
processes talking over real sockets, with their rings read from redis-server.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp

from testkit.ports import free_port
from testkit.waits import until_reported
from tests.integration.cluster.conftest import HOST, fetch


async def test_range_requests_are_forwarded_cold_and_warm_and_answer_the_exact_bytes(
        origin, start_cluster, redis_server):
    body = bytes(range(256)) * 4000  # 1,024,000 bytes
    origin.put("/range.bin", body)
    cluster = await start_cluster(3, redis_url=redis_server.url)
    served_by = set()
    async with aiohttp.ClientSession() as s:
        for round_ in range(2):  # the first request is cold, wherever it enters
            for name, node in cluster.nodes.items():
                start = 1000 * (round_ * 3 + int(name[-1])) + 17
                status, headers, got = await fetch(s, node.url, "/range.bin", Range=f"bytes={start}-{start + 49_999}")
                assert status == 206, (name, status)
                assert headers["Content-Range"] == f"bytes {start}-{start + 49_999}/{len(body)}"
                assert got == body[start:start + 50_000]
                if "X-Nezha-Served-By" in headers:
                    served_by.add((name, headers["X-Nezha-Served-By"]))
    assert any(entered != owner for entered, owner in served_by), "no request was relayed"
    assert origin.requests["/range.bin"] == 1


def _node(node_id: str, port: int, redis_url: str, data_dir, origin_url: str) -> subprocess.Popen:
    # One process a node (as `nezha up` starts them): two nodes of the default
    # `--workers auto` are six interpreters starting at once on a two-core machine.
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir),
         "--origin", f"{HOST}={origin_url}", "--redis-url", redis_url, "--node-id", node_id,
         "--advertise", f"127.0.0.1:{port}", "--replicas", "1", "--log-level", "warning", "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "NEZHA_CLUSTER_TOKEN": "test-token"})
    return proc


async def _ring_set(redis_url: str, *members: str) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nezha", "ring", "set", *members,
                                                "--redis-url", redis_url, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT)
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()


async def _ring_of(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen, expect: list[str]) -> None:
    """Until the node, started or not yet, reports the ring `expect` as the one it routes by.

    What the node reports decides, not a clock: it reads the ring at start
    (one bounded read) and again from the watch if that read came too late;
    the wait ends when its /readyz names the ring, or at once if it exits."""
    await until_reported(url + "/readyz", lambda st: st.get("ready") and sorted(st["ring_nodes"]) == expect,
                         proc=proc, what=f"nezha cache at {url}", session=session)


async def test_two_node_processes_that_each_think_the_other_owns_everything_answer_within_one_forward(
        origin, redis_server, tmp_path):
    """Each node reads its ring from its own Redis database: a's ring is {b}, b's is {a}."""
    for i in range(20):
        origin.put(f"/d/{i}", str(i).encode() * 3000)
    pa, pb = free_port(), free_port()
    base = redis_server.url.rsplit("/", 1)[0]
    url_a, url_b = f"{base}/1", f"{base}/2"
    await _ring_set(url_a, f"b=127.0.0.1:{pb}")
    await _ring_set(url_b, f"a=127.0.0.1:{pa}")
    procs = [_node("a", pa, url_a, tmp_path / "a", origin.url),
             _node("b", pb, url_b, tmp_path / "b", origin.url)]
    try:
        async with aiohttp.ClientSession() as s:
            await _ring_of(s, f"http://127.0.0.1:{pa}", procs[0], ["b"])
            await _ring_of(s, f"http://127.0.0.1:{pb}", procs[1], ["a"])
            forwarded = 0
            for i in range(20):
                for entry, other in ((pa, "b"), (pb, "a")):
                    status, headers, got = await asyncio.wait_for(
                        fetch(s, f"http://127.0.0.1:{entry}", f"/d/{i}"), timeout=10)
                    assert status == 200 and got == str(i).encode() * 3000
                    # At most one forward: the other node answered for itself, or
                    # this one had a fresh copy of its own (a fetched object stays).
                    served_by = headers.get("X-Nezha-Served-By")
                    label = headers["X-Nezha-Cache"]
                    if served_by is None:
                        assert label == "hit", (entry, i, label)
                    else:
                        # peer-miss-joined: the other node was already copying the object
                        # (the replica push of the first fill) when this request reached it.
                        assert served_by == other and label in ("peer-miss", "peer-hit", "peer-miss-joined"), (
                            entry, i, label)
                        forwarded += 1
        assert forwarded >= 20  # every object's first request crossed to the other node
        # Disagreeing rings may cost one extra origin fetch per object: the
        # second request can reach b while b's fill is still being committed,
        # and b forwards it to a, which b thinks owns it. Never more: no loop.
        assert all(origin.requests[f"/d/{i}"] <= 2 for i in range(20)), dict(origin.requests)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
