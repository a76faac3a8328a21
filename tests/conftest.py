"""Fixtures shared by every test: a local origin and a real redis-server.

Built on testkit (free ports, waits, the redis-server launcher, the rule for
missing tools). In CI (`CI=true`) a missing tool is an error, never a skip:
a green run must mean the tests ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from nezha import logs
from testkit.bytecode import compile_project
from testkit.heap import pytest_runtest_setup  # noqa: F401  (hook)
from testkit.redis_server import RedisServer
from testkit.timeouts import pytest_exception_interact, pytest_timeout_set_timer  # noqa: F401  (hooks)
from testkit.tools import require_tool

# Hypothesis fails an example that takes over 200 ms by default: a timing bound inside unit tests, which a
# loaded 2-core box crosses (tests/unit/cachenode/http/test_vary.py took 412 ms for one example at load 20).
# What the properties prove does not depend on time; how long they take is no one's promise.
settings.register_profile("nezha", deadline=None)
settings.load_profile("nezha")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The project's byte code, once, so that the node processes the tests start
    do not each compile it from source (testkit/bytecode.py)."""
    compile_project(Path(__file__).resolve().parent.parent)


@pytest.fixture(autouse=True)
def logging_as_a_fresh_process():
    """Every test starts with logging as a fresh process has it (nezha/logs.py `reset`). A test that
    configures it, directly or through a command run in-process, binds structlog to its own output (a
    StringIO, or the stdout capsys held for it), and a later test's events went there instead of to its
    own capture: run after tests/unit, tests/integration/cluster/test_embedded_index.py read nothing."""
    yield
    logs.reset()


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
