"""Waiting until a descriptor is readable or writable, on any event loop.

For sockets the node moves bytes on itself (sendfile of a hit's body, splice
of a relay, the peek at a ClientHello). A loop refuses readers and writers
on a descriptor one of its transports owns, so callers wait on one no
transport watches: a duplicate, or a socket no transport has taken.
"""

from __future__ import annotations

import asyncio


async def ready(fd: int, *, write: bool = False, timeout: float | None = None) -> None:
    """Until `fd` is writable (`write`) or readable; TimeoutError after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: fut.done() or fut.set_result(None))
    try:
        if timeout is None:
            await fut
        else:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel
                await fut
    finally:
        remove(fd)
