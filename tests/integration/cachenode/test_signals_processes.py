"""`nezha cache` and its signals (docs/operations.md, "Signals"): SIGHUP to the
node's process group, as a closed terminal sends it, stops the node as
SIGTERM does: the download in flight is finished, then the node exits 0.

Before, SIGHUP ended the node at once (exit 129, no log line), the client
got part of the body and a partial file stayed on disk.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from testkit.ports import free_port
from testkit.waits import wait_for
from testkit.logs import log_events

HOST = "datasets.example"
ROOT = Path(__file__).resolve().parents[3]
BODY = (bytes(range(251)) * (6 * 1024 * 1024 // 251 + 1))[:6 * 1024 * 1024]


def events(log: Path, name: str) -> list[dict]:
    return log_events(log, name)


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_slow_download_survives_sighup_to_the_nodes_process_group_and_completes(tmp_path, origin, workers):
    origin.put("/slow.bin", BODY, headers={"Cache-Control": "max-age=3600"}, rate=2 * 1024 * 1024)
    port = free_port()
    log = tmp_path / "node.log"
    data = tmp_path / "data"
    with open(log, "wb") as out:
        # A session of its own: the node leads its process group, as at a terminal.
        proc = subprocess.Popen(
            [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
             "--origin", f"{HOST}={origin.url}", "--workers", str(workers), "--fill-streams", "1"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True)
    try:
        await wait_for(lambda: events(log, "node_listening")
                       and len(events(log, "worker_listening")) == workers - 1, timeout=60)
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.get(f"http://127.0.0.1:{port}/slow.bin", headers={"Host": HOST}) as r:
                assert r.status == 200
                first = await r.content.readexactly(256 * 1024)  # about a second of 3 into the download
                os.killpg(proc.pid, signal.SIGHUP)
                rest = await r.content.read()
        assert first + rest == BODY, f"{len(first) + len(rest)} of {len(BODY)} bytes after SIGHUP"
        assert await asyncio.to_thread(proc.wait, 60) == 0
        assert events(log, "node_stopping"), "the node logs its stop"
        if workers > 1:
            assert [e["signal"] for e in events(log, "workers_stopping")] == ["SIGHUP"]
        assert not [p.name for p in data.rglob("*") if p.name.endswith(".part")]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def test_ctrl_c_of_a_node_with_workers_stops_it_without_a_supervisor_gone_warning(tmp_path, origin):
    """Ctrl-C reaches the whole process group: an ordinary stop, not a supervisor lost."""
    port = free_port()
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir",
             str(tmp_path / "data"), "--origin", f"{HOST}={origin.url}", "--workers", "2"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True)
    try:
        await wait_for(lambda: events(log, "node_listening") and events(log, "worker_listening"), timeout=60)
        os.killpg(proc.pid, signal.SIGINT)
        assert await asyncio.to_thread(proc.wait, 60) == 0
        assert events(log, "node_stopping") and events(log, "worker_stopping")
        assert events(log, "supervisor_gone") == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
