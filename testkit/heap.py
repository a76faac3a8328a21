"""The cyclic collector kept out of each test's timing: what earlier tests
left alive is frozen before a test begins.

One process runs the whole suite, and its heap grows with every module
imported and every object a test leaves for a later collection. A full pass
of the collector over that heap took 200 to 400 ms of CPU in
tests/integration/cachenode (0.4 to 1.4 s of wall-clock time on a loaded
2-core box; measured with `gc.callbacks`), and it comes whenever an
allocation crosses the threshold: inside a later test, where it stops the
event loop that test's nodes, peers and clients share. A node's liveness
probe has 1 s to be answered (cachenode/peers/asks.py): a probe sent just
before such a pause went unanswered, and a live chunk owner was marked down
(`test_peer_down_by_probe.py`, once in a full run). A node runs in a process
of its own, whose heap is its own; the pause was the test process's.

So before each test's setup everything alive is moved out of the collector's
generations (`gc.freeze`): a collection inside a test walks only what that
test made. Every `FULL_EVERY` tests, before the next one's setup, the frozen
heap is thawed and collected in full, so the garbage earlier tests left is
still freed, between tests. Loaded by tests/conftest.py.
"""

from __future__ import annotations

import gc

import pytest

# Tests between two full collections, run between tests: a full collection
# came about every 80 tests in tests/integration/cachenode, so the collector
# does about the work it did, outside the tests.
FULL_EVERY = 50

_started = 0


def before_test(started: int) -> None:
    """The heap as test number `started` (from 1) should find it: everything
    alive frozen, after a full collection every FULL_EVERY tests."""
    if started % FULL_EVERY == 0:
        gc.unfreeze()
        gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures are set up: what they make is the test's own."""
    global _started
    _started += 1
    before_test(_started)
