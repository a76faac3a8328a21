"""Fixtures shared by every test: real tools, free ports, a real redis-server.

In CI (`CI=true`) a missing tool is an error, never a skip: a green run must
mean the tests ran.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str) -> str:
    """Path of executable `name`; skip locally, fail in CI, when it is missing.

    `.tools/bin` (where `.ci/run` puts the pinned helm and kubectl) comes before PATH.
    """
    path = shutil.which(name, path=str(Path(__file__).resolve().parents[1] / ".tools" / "bin")) or shutil.which(name)
    if path is None:
        msg = f"{name} is not installed (bash .ci/run installs it)"
        if IN_CI:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server on 127.0.0.1, which a test may stop and start again
    on the same port (to prove that nodes survive Redis going away)."""

    def __init__(self, exe: str, workdir: Path, password: str | None = None) -> None:
        self.exe = exe
        self.workdir = workdir
        self.port = free_port()
        self.password = password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on {self.port} within 10 s")

    def stop(self, *, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
async def origin(aiohttp_server):
    """A local origin on 127.0.0.1 (tests.support_origin.TestOrigin), its URL in `.url`."""
    from tests.support_origin import TestOrigin

    o = TestOrigin()
    server = await aiohttp_server(o.app(), host="127.0.0.1")
    o.url = str(server.make_url("")).rstrip("/")
    return o


@pytest.fixture
def redis_server(tmp_path: Path):
    server = RedisServer(require_tool("redis-server"), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)
