"""testkit.waits.until_reported: a wait that ends on what a process reports, or on its exit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from aiohttp import web

from testkit.ports import free_port
from testkit.waits import NotAnswering, until_reported


async def test_the_first_status_that_satisfies_the_check_is_returned(aiohttp_server):
    asked = 0

    async def readyz(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        ready = asked >= 3
        return web.json_response({"ready": ready, "asked": asked}, status=200 if ready else 503)

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    server = await aiohttp_server(app, host="127.0.0.1")
    status = await until_reported(str(server.make_url("/readyz")), lambda st: st["ready"], timeout=10)
    assert status == {"ready": True, "asked": 3}


async def test_a_process_that_exits_ends_the_wait_at_once_naming_its_exit():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(NotAnswering, match="exited with code 3 before it answered"):
        await until_reported(f"http://127.0.0.1:{free_port()}/readyz", lambda st: True, proc=proc,
                             what="the process", timeout=30)


async def test_a_wait_that_runs_out_names_the_last_status_seen(aiohttp_server):
    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"ring_nodes": ["a"]})

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    server = await aiohttp_server(app, host="127.0.0.1")
    with pytest.raises(NotAnswering, match=r"did not report what the test waits for .* \(last: reported "
                                           r"\{'ring_nodes': \['a'\]\}\)"):
        await until_reported(str(server.make_url("/readyz")), lambda st: st["ring_nodes"] == ["b"], timeout=0.3)
