"""A loop stops when its task is cancelled, even when a library swallowed the cancellation.

redis-py (8.1) writes each command under `asyncio.wait_for`, and on Python
3.11 `wait_for` returns the write's result instead of raising when the
cancellation lands just as the write completes (CPython gh-86296, fixed in
3.12). Measured: about one cancelled Index call in four returned normally.
The task still counts the request (`Task.cancelling()`), but a loop that
never awaits a cancellable point again, or catches what follows, goes on:
a killed controller kept reconciling, and its shutdown waited forever. Every
loop that goes round calling Redis (the controller's, the Index's flush,
watch and refresh loops, a node's replica batches) calls
`stop_if_cancelled()` once a round; one copy here, for every component.
"""

from __future__ import annotations

import asyncio


def stop_if_cancelled() -> None:
    """Raise CancelledError if this task was asked to stop and that request was lost on the way."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError(f"{task.get_name()}: cancelled while a library call swallowed it")
