"""A node process killed (-9) in the middle of thousands of small fills, then
started again on its folder: every object is served exact, from disk if it
was stored whole, fetched again if not; nothing torn or wrong is served
(docs/cache-node.md, "Nothing partial is ever servable", its "Small
objects")."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from cachenode.store.small import read_sealed
from testkit.ports import free_port
from testkit.waits import until_http

HOST = "datasets.example"
ROOT = Path(__file__).resolve().parents[3]
COUNT = 2000
KILL_AFTER = 700


def body_of(n: int) -> bytes:
    """A distinct body per object, 2 to 10 KB: one object's bytes served for another's would show."""
    seed = hashlib.sha256(str(n).encode()).digest()
    return (seed * (2000 + n % 8000 // 32 + 1))[:2000 + n % 8000]


def start(data: Path, port: int, origin_url: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
             "--origin", f"{HOST}={origin_url}", "--workers", "1", "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


async def test_a_node_killed_mid_fills_serves_every_small_object_exact_after_restart(tmp_path, origin):
    for n in range(COUNT):
        origin.put(f"/d/{n}.jpg", body_of(n), headers={"Cache-Control": "max-age=3600"})
    port, data, log = free_port(), tmp_path / "data", tmp_path / "node.log"
    url = f"http://127.0.0.1:{port}"
    proc = start(data, port, origin.url, log)
    try:
        await until_http(url + "/readyz", proc=proc, log=log, what="cache node", timeout=60)
        done = 0
        killed = asyncio.Event()
        sem = asyncio.Semaphore(64)

        async with aiohttp.ClientSession() as s:
            async def fill(n: int) -> None:
                nonlocal done
                async with sem:
                    if killed.is_set():
                        return
                    try:
                        async with s.get(f"{url}/d/{n}.jpg", headers={"Host": HOST}) as r:
                            got = await r.read()
                    except (aiohttp.ClientError, ConnectionError):
                        return  # the node died under it
                    assert got == body_of(n)
                    done += 1
                    if done == KILL_AFTER:
                        os.kill(proc.pid, signal.SIGKILL)
                        killed.set()
            await asyncio.gather(*(fill(n) for n in range(COUNT)))
        assert killed.is_set()
        proc.wait(10)
        asked_before = dict(origin.requests)

        # What the killed node left: sealed files that hold, and maybe some that do not.
        whole = [p for p in (data / "objects").rglob("*.obj") if read_sealed(p) is not None]
        assert whole, "the node stored small objects before it was killed"

        proc = start(data, port, origin.url, log)
        await until_http(url + "/readyz", proc=proc, log=log, what="restarted cache node", timeout=60)
        outcomes: dict[str, int] = {}
        async with aiohttp.ClientSession() as s:
            for n in range(COUNT):
                async with s.get(f"{url}/d/{n}.jpg", headers={"Host": HOST}) as r:
                    got = await r.read()
                    assert r.status == 200 and got == body_of(n), f"object {n} served wrong after the restart"
                    outcome = r.headers["X-Nezha-Cache"]
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                path = f"/d/{n}.jpg"
                if outcome == "hit":
                    assert origin.requests[path] == asked_before.get(path, 0)
                else:  # lost in the crash (or never asked): fetched again, once
                    assert outcome == "miss" and origin.requests[path] == asked_before.get(path, 0) + 1
        assert outcomes["hit"] == len(whole), outcomes
        assert outcomes["hit"] + outcomes["miss"] == COUNT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
