"""A node on uvloop (`event_loop: uvloop`) serves what it serves on asyncio's loop, whole.

uvloop's loop has no `loop.sendfile`; a node under it used to cut warm hits
short after what one sendfile(2) call took (docs/benchmarks.md). Bodies now
go out through `serve.sendfile_rest`, which works on any loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import aiohttp
import pytest
import uvloop  # noqa: F401  (the [test] extra installs it: the test of `event_loop: uvloop` needs it)

from tests.integration.cachenode.conftest import HOST, exchange

BIG = os.urandom(24 << 20)  # far more than a loopback socket takes in one sendfile


def get(path: str, *extra: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", f"Host: {HOST}", *extra, "", ""]).encode()


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_large_hits_leave_whole_on_the_fast_path_and_the_handler(
        origin, node_process, session, monkeypatch, event_loop):
    monkeypatch.setenv("NEZHA_EVENT_LOOP", event_loop)
    origin.put("/big.bin", BIG)
    node = node_process(origin.url)
    await node.ready(session)
    digest = hashlib.sha256(BIG).hexdigest()
    async with session.get(f"http://127.0.0.1:{node.port}/big.bin", headers={"Host": HOST}) as r:
        assert r.status == 200 and hashlib.sha256(await r.read()).hexdigest() == digest  # cold
    await node_settled(session, node.port)
    # A plain hit and a range (the fast path), and a range with a field only the aiohttp handler takes,
    # each far beyond one sendfile.
    [(head, body)] = await exchange(node.port, get("/big.bin"), timeout=30)
    assert head.startswith(b"HTTP/1.1 200") and b"X-Nezha-Cache: hit" in head
    assert hashlib.sha256(body).hexdigest() == digest
    for extra in ((), ("X-Request-Id: 1",)):
        [(head, body)] = await exchange(node.port, get("/big.bin", "Range: bytes=1000-", *extra), timeout=30)
        assert head.startswith(b"HTTP/1.1 206") and body == BIG[1000:]
    served = [e for e in node.events() if e.get("event") == "request_completed" and e.get("status") == 206]
    assert [e.get("fast", False) for e in served] == [True, False]
    assert [e for e in node.events() if e.get("event") == "node_listening"], node.err.read_text()


async def node_settled(session: aiohttp.ClientSession, port: int) -> None:
    for _ in range(200):
        async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
            if (await r.json()).get("fills_in_flight") == 0:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("node still filling")
