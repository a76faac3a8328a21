"""The Index's background loops stop when their task is cancelled, also when a Redis call swallowed it.

redis-py 8.1 writes each command under `asyncio.wait_for`; on Python 3.11 a
cancellation that lands as the write completes is lost (CPython gh-86296,
nezha/cancels.py). A loop that only stopped on its `closing` flag then ran
on after `task.cancel()`: each test cancels a loop that does nothing but
call a real redis-server, at many moments, and counts the loops that went
on. The flag is left unset, so only the cancellation can stop them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine

import pytest
import redis.asyncio as aredis

from nezha.index.handle import Index
from nezha.index.schema import CHANNEL_RING

HOST = "www.cs.toronto.edu"
ROUNDS = 150
ENDS_WITHIN = 5.0  # a guard against hanging: a loop that stops does so at its next await


async def cancelled_while_busy(index: Index, loop_of: Callable[[Index], Coroutine], *,
                               busy: Callable[[], None] = lambda: None) -> int:
    """Start the loop, cancel it once it is busy with Redis (a random moment in its calls), and count
    the rounds in which it went on after its cancellation (three are enough to fail)."""
    went_on = 0
    for _ in range(ROUNDS):
        if went_on >= 3:
            break
        task = asyncio.create_task(loop_of(index))
        busy()
        await asyncio.sleep(random.uniform(0.0, 0.004))
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=ENDS_WITHIN)
        if not done:
            went_on += 1
            index.conn.closing = True  # end it the old way, so the next round starts clean
            task.cancel()
            await asyncio.wait([task])
            index.conn.closing = False
    return went_on


@pytest.fixture
async def index(redis_server):
    made = Index(redis_url=redis_server.url, node_id="nezha-cache-0", flush_interval=0.001,
                 refresh_interval=0.001, backoff_max=0.05)
    await made.set_membership({"nezha-cache-0": "127.0.0.1:8080"})
    yield made
    await made.close(flush_timeout=0.5)


async def test_the_refresh_loop_stops_when_cancelled_during_its_redis_reads(index):
    assert await cancelled_while_busy(index, lambda i: i.watch.refresh_loop()) == 0


async def test_the_flush_loop_stops_when_cancelled_during_its_redis_writes(index):
    def busy() -> None:
        for n in range(20):  # something to send in each flush
            index.count(HOST, hits=1)
            index.object_accessed(f"{HOST}/d/{n}")

    assert await cancelled_while_busy(index, lambda i: i.stats.flush_loop(), busy=busy) == 0


async def test_the_membership_watch_stops_when_cancelled_during_the_reads_a_message_starts(index, redis_server):
    publisher = aredis.from_url(redis_server.url)

    stop = asyncio.Event()

    async def publish() -> None:  # each message makes the watch read the membership again
        # Ended by a flag: cancelled, this loop of Redis calls would have the same trouble.
        while not stop.is_set():
            await publisher.publish(CHANNEL_RING, "1")

    publishing = asyncio.create_task(publish())
    try:
        assert await cancelled_while_busy(index, lambda i: i.watch.watch_loop()) == 0
    finally:
        stop.set()
        await publishing
        await publisher.aclose()
