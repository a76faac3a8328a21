"""`nezha up`: a local cluster from one command, stopped cleanly by SIGTERM."""

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp

from tests.conftest import free_port
from tests.support_origin import TestOrigin


def _free_run(n: int) -> int:
    from cachenode.demo import _free_run as run

    return run(n)


async def test_up_starts_nodes_prints_them_and_stops_on_sigterm(aiohttp_server, tmp_path):
    origin = TestOrigin()
    origin.put("/f.bin", b"f" * 50_000)
    server = await aiohttp_server(origin.app(), host="127.0.0.1")
    base = _free_run(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "up", "--nodes", "2", "--base-port", str(base),
         "--data-dir", str(tmp_path), "--origin", f"www.cs.toronto.edu=http://127.0.0.1:{server.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        loop = asyncio.get_running_loop()
        lines = []
        while len([x for x in lines if x.startswith("node-")]) < 2:
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 30)
            assert line, f"nezha up exited early with {proc.poll()}"
            lines.append(line.strip())
        assert "replicas-per-key 2" in lines  # the default for two or more nodes
        nodes = [x.split() for x in lines if x.startswith("node-")]
        assert [n[0] for n in nodes] == ["node-0", "node-1"]
        assert [n[1] for n in nodes] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
        pids = [int(n[2].removeprefix("pid=")) for n in nodes]
        async with aiohttp.ClientSession() as s:
            for _, address, _ in nodes:
                async with s.get(f"http://{address}/readyz") as r:
                    assert (await r.json())["replicas"] == 2
            for _, address, _ in nodes:
                async with s.get(f"http://{address}/f.bin", headers={"Host": "www.cs.toronto.edu"}) as r:
                    assert r.status == 200 and await r.read() == b"f" * 50_000
        assert origin.requests["/f.bin"] == 1
        proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, proc.wait, 30) == 0
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        assert (tmp_path / "node-0").is_dir() and (tmp_path / "node-1").is_dir()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_help_says_it_never_removes_a_node_and_so_never_drains():
    out = subprocess.run([sys.executable, "-m", "nezha", "up", "--help"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    text = " ".join(out.split())
    assert "never adds or removes a node" in text and "drains first" in text
    assert "default min(2, NODES)" in text
