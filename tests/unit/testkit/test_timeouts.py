"""A test that fails and then hangs in its teardown still ends (testkit/timeouts.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GUARD = 120.0  # seconds: a run that is not done by then hangs, however loaded the box

HANGS = textwrap.dedent("""
    import time
    import pytest

    @pytest.fixture
    def waits_forever_on_teardown():
        yield
        time.sleep(3600)

    @pytest.mark.timeout(1)
    def test_times_out(waits_forever_on_teardown):
        time.sleep(3600)
""")


def start(tmp_path: Path, *plugins: str) -> subprocess.Popen:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            *[a for p in plugins for a in ("-p", p)], str(tmp_path / "test_hangs.py")]
    out = open(tmp_path / "out.txt", "w")
    return subprocess.Popen(argv, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def printed(tmp_path: Path) -> str:
    return (tmp_path / "out.txt").read_text()


def test_a_teardown_that_hangs_after_a_timed_out_test_is_failed_too_and_the_run_ends(tmp_path):
    run = start(tmp_path, "testkit.timeouts")
    try:
        assert run.wait(timeout=GUARD) == 1, printed(tmp_path)
    finally:
        run.kill()
    out = printed(tmp_path)
    assert "1 failed, 1 error" in out, out
    assert out.count("Timeout (>1.0s) from pytest-timeout") >= 2, out  # the call's, then the teardown's


def test_without_it_pytest_timeout_leaves_the_teardown_to_hang(tmp_path):
    """What the module works around, shown on the pytest-timeout this project pins: if an upgrade
    arms the timer for the teardown itself, this fails and testkit/timeouts.py can go."""
    run = start(tmp_path)
    try:
        deadline = time.monotonic() + GUARD
        while not printed(tmp_path).rstrip().endswith("F"):  # the call failed: the teardown has begun
            assert run.poll() is None and time.monotonic() < deadline, printed(tmp_path)
            time.sleep(0.1)
        time.sleep(5)  # five times the test's timeout
        assert run.poll() is None, printed(tmp_path)
    finally:
        run.kill()
        run.wait()
