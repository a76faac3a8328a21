"""A node's background work: fills running on after their first reader,
replication, chunk pushes, hand-off copies.

Owned here, below every room that starts such work, so that starting it is
a call down the layers: the node builds one `Tasks` first and hands its
`spawn` to each room; the node's `settled()` waits for what is running and
its `stop()` cancels it.
"""

from __future__ import annotations

import asyncio
from typing import Coroutine


class Tasks:
    def __init__(self) -> None:
        self.running: set[asyncio.Task] = set()  # a task leaves once done

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """Run background work that `cancel()` ends and the node's `settled()` waits for."""
        task = asyncio.get_running_loop().create_task(coro)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    async def cancel(self) -> None:
        """Cancel everything still running, and wait until it has ended."""
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
