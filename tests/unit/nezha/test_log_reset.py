"""Logging back to a fresh process's (nezha/logs.py `reset`), as every test starts (tests/conftest.py)."""

from __future__ import annotations

import io
import sys

import structlog

from nezha import logs


def test_after_a_reset_events_go_to_the_stdout_of_the_moment_not_to_the_stream_configure_bound(capsys):
    bound = io.StringIO()
    logs.configure(stream=bound)
    structlog.get_logger("test").info("before_reset")
    logs.reset()
    structlog.get_logger("test").info("after_reset")
    out = capsys.readouterr().out
    assert "after_reset" in out and "before_reset" not in out
    assert "after_reset" not in bound.getvalue()


def test_configure_without_a_stream_binds_the_stdout_of_its_moment_which_a_reset_lets_go(capsys):
    """Why the reset is needed: a command run in-process binds the stdout capsys held for its test."""
    held = sys.stdout
    logs.configure()
    logs.reset()
    replaced = io.StringIO()
    sys.stdout = replaced
    try:
        structlog.get_logger("test").info("after_reset")
    finally:
        sys.stdout = held
    assert "after_reset" in replaced.getvalue()
