"""The index a local cluster runs on when it was given no Redis URL (`nezha up`, `nezha demo`).

A real `redis-server` on a free port of 127.0.0.1 when one is installed, else
fakeredis' TCP server in a thread of this process, so that a fresh machine
needs nothing installed; either way several node processes share it through
its URL.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from nezha.errors import ConfigError
from nezha.index.connection import IndexUnavailable
from nezha.localproc import die_with_parent, free_port, wait_listening

log = structlog.get_logger("nezha.index")


async def _start_redis_server(exe: str, workdir: Path) -> tuple[str, Callable[[], Awaitable[None]]]:
    for _ in range(3):  # the free port can be taken between choosing and binding it
        port = free_port()
        # A session of its own: a Ctrl-C or a hang-up at the terminal reaches the command that
        # started it, which stops it after its nodes; and it dies with that command however
        # the command ends (die_with_parent), so it never serves on alone.
        proc = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent())
        if await wait_listening(port, proc, timeout=10):
            break
        proc.kill()
        proc.wait()
    else:
        raise IndexUnavailable(f"embedded redis-server ({exe}) did not start on 127.0.0.1 after 3 tries")

    async def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.to_thread(proc.wait, 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        log.info("embedded_index_stopped", kind="redis-server", port=port)

    return f"redis://127.0.0.1:{port}/0", stop


def _start_fakeredis() -> tuple[str, Callable[[], Awaitable[None]]]:
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    # Connection threads must not keep the process alive nor block closing.
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, name="nezha-fakeredis", daemon=True)
    thread.start()
    port = server.server_address[1]

    async def stop() -> None:
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        log.info("embedded_index_stopped", kind="fakeredis", port=port)

    return f"redis://127.0.0.1:{port}/0", stop


async def embedded_index(workdir: Path, *, kind: str = "auto") -> tuple[str, Callable[[], Awaitable[None]]]:
    """Start a local index for nodes that were given no --redis-url; returns (url, async stop).

    `kind`: "redis-server" (the installed binary, on a free port of
    127.0.0.1), "fakeredis" (fakeredis' TCP server in a thread of this
    process, so a fresh machine needs nothing installed), or "auto": the
    first if installed, else the second. Either way several node processes
    share it through the URL.
    """
    if kind not in ("auto", "redis-server", "fakeredis"):
        raise ConfigError(f"embedded index kind must be auto, redis-server or fakeredis, got {kind!r}")
    exe = shutil.which("redis-server") if kind in ("auto", "redis-server") else None
    if kind == "redis-server" and exe is None:
        raise ConfigError("embedded index kind redis-server asked for, but redis-server is not installed")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if exe is not None:
        url, stop = await _start_redis_server(exe, workdir)
        chosen = "redis-server"
    else:
        url, stop = _start_fakeredis()
        chosen = "fakeredis"
    log.info("embedded_index_started", kind=chosen, url=url)
    return url, stop
