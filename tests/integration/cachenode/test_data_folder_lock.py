"""One node per data folder (nezha/folder_lock.py): a second `nezha cache` on a
folder a running node holds refuses to start, naming the folder and the
holder's pid; a node's own workers share its hold; the lock goes with the
node however it ends, SIGKILL included.

Before, the second node started silently on the same folder with its own
index and its own capacity on one disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from testkit.ports import free_port
from testkit.waits import wait_for

HOST = "datasets.example"
ROOT = Path(__file__).resolve().parents[3]


def argv(data: Path, origin_url: str, port: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
            "--origin", f"{HOST}={origin_url}", "--workers", str(workers)]


def start(data: Path, origin_url: str, log: Path, workers: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv(data, origin_url, port, workers), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, port


def serving(log: Path, workers: int) -> bool:
    names = [json.loads(x).get("event") for x in log.read_text(errors="replace").splitlines() if x.startswith("{")]
    return "node_listening" in names and names.count("worker_listening") == workers - 1


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_second_node_on_a_held_data_folder_refuses_naming_it_and_the_holders_pid(tmp_path, origin, workers):
    origin.put("/f.bin", b"f" * 10_000)
    data, log = tmp_path / "shared", tmp_path / "first.log"
    first, port = start(data, origin.url, log, workers)
    try:
        await wait_for(lambda: serving(log, workers), timeout=60)
        second = await asyncio.to_thread(subprocess.run, argv(data, origin.url, free_port(), 1), capture_output=True,
                                         text=True, timeout=60, cwd=ROOT)
        assert second.returncode == 1, (second.stdout, second.stderr)
        assert second.stderr.strip() == (
            f"nezha cache: --data-dir {str(data)!r} is in use by pid {first.pid} (nezha cache): one node per data "
            "folder; stop it, or give this one a folder of its own")
        assert "store_opened" not in second.stdout  # refused before it read the folder
        for _ in range(4):  # the first node, with each of its workers, serves on (a connection each)
            async with aiohttp.ClientSession() as own:
                async with own.get(f"http://127.0.0.1:{port}/f.bin", headers={"Host": HOST}) as r:
                    assert r.status == 200 and await r.read() == b"f" * 10_000
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)


async def test_a_node_killed_with_sigkill_leaves_its_folder_free_for_the_next(tmp_path, origin):
    data = tmp_path / "data"
    first, _ = start(data, origin.url, tmp_path / "first.log", 2)
    try:
        await wait_for(lambda: serving(tmp_path / "first.log", 2), timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second, _ = start(data, origin.url, tmp_path / "second.log", 1)
        try:
            # Its workers get SIGKILL with it (die_with_parent): then the lock is free.
            await wait_for(lambda: serving(tmp_path / "second.log", 1) or second.poll() is not None, timeout=60)
            assert second.poll() is None, (tmp_path / "second.log").read_text()
        finally:
            second.terminate()
            assert await asyncio.to_thread(second.wait, 30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
