"""Disk steps on one object's files, run one after another in the order asked.

An eviction's unlink of `<id>.meta` that is still queued when the same key
is committed again must not land after the new meta; so every step on an
object's files (commit, refresh, unlink after eviction or replacement)
waits for the one asked for before it. Unlinks are not awaited by whoever
caused them (eviction happens inside `Store.reserve`, which is sync), so
every step is tracked until done: `idle()` waits for them all.
"""

from __future__ import annotations

import asyncio
from typing import Callable


class Steps:
    """Blocking functions run in the default executor, in order per object id."""

    def __init__(self) -> None:
        self._pending: set[asyncio.Future] = set()  # steps not yet done
        self._last: dict[str, asyncio.Future] = {}  # object id -> its latest step

    def run(self, oid: str, fn: Callable[[], object]) -> asyncio.Future:
        """Run blocking `fn` in the executor after every earlier step on object `oid`.

        The returned future is tracked until done (see `idle`). Awaiting it
        through `asyncio.shield` keeps a cancelled caller from starting the
        next step while this one still runs in its thread.
        """
        loop = asyncio.get_running_loop()
        before = self._last.get(oid)
        if before is None:
            step = loop.run_in_executor(None, fn)
        else:
            step = loop.create_future()

            def start(_: asyncio.Future) -> None:
                inner = loop.run_in_executor(None, fn)

                def done(f: asyncio.Future) -> None:
                    if f.cancelled():
                        step.cancel()
                    elif f.exception() is not None:
                        step.set_exception(f.exception())
                    else:
                        step.set_result(f.result())
                inner.add_done_callback(done)
            before.add_done_callback(start)
        self._last[oid] = step
        self._pending.add(step)

        def finished(f: asyncio.Future) -> None:
            self._pending.discard(f)
            if self._last.get(oid) is f:
                del self._last[oid]
            if not f.cancelled():
                f.exception()  # retrieved here, so a cancelled awaiter leaves no "never retrieved" warning
        step.add_done_callback(finished)
        return step

    async def idle(self) -> None:
        """Wait until every step asked for so far is done."""
        while self._pending:
            await asyncio.wait(list(self._pending))
