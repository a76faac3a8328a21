"""pytest-timeout's timer, armed again for the teardown of a test that failed.

pytest-timeout arms one timer for a test's setup, call and teardown
together, but cancels it in `pytest_exception_interact`, which pytest calls
for every failure, with or without a debugger (its purpose: not to fire
inside pdb). So a test that failed, by timing out or otherwise, runs its
teardown with no timer at all: a fixture that waits forever on what the
failed test left behind (a controller that never stops, a process that
never exits) hangs the whole run, and CI ends at its own limit with nothing
landed. Seen in this suite: a controller whose cancellation redis-py
swallowed held `test_autoscale.py`'s teardown for over 15 minutes.

Here, once pytest-timeout has cancelled its timer for a failure, the same
timer is armed again, for another `timeout` seconds from then, unless the
run is under `--pdb` or `--trace`: a teardown that hangs fails as a
timed-out test does, stacks dumped, and the run goes on. Loaded by
tests/conftest.py; the timer itself is pytest-timeout's.
"""

from __future__ import annotations

import pytest

_SETTINGS = pytest.StashKey[object]()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> None:
    """Note the item's timeout settings, to arm them again; the timer is pytest-timeout's (None: go on)."""
    item.stash[_SETTINGS] = settings


@pytest.hookimpl(trylast=True)
def pytest_exception_interact(node: pytest.Item | pytest.Collector) -> None:
    """After pytest-timeout cancelled the failed test's timer (its own `pytest_exception_interact`, tryfirst)."""
    settings = node.stash.get(_SETTINGS, None)
    config = node.config
    if settings is None or config.getoption("usepdb", False) or config.getoption("trace", False):
        return
    config.pluginmanager.hook.pytest_timeout_set_timer(item=node, settings=settings)
