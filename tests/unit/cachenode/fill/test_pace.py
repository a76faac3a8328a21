"""A fill held to its replica (cachenode/fill/pace.py): it reads at most WINDOW past the slowest of the key's
other owners reading it, never for a replica that stood still STALL, and HOLD seconds in all at most; while
held, its socket's receive buffer is capped to what the held pace takes in a round trip."""

from __future__ import annotations

import asyncio
import socket

from cachenode.fill.pace import FREE, HOLD, STALL, WINDOW, Pace, Window, held, pace_of
from tests.support_pace import wait_ends


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_fill_runs_free_until_a_replica_reads_it_and_then_keeps_within_window_of_the_slowest():
    pace = Pace()
    assert await pace.room(64 << 20) == FREE
    pace.join(0)  # another node's read, not the key's owner: it holds the clients only
    assert pace.fill_end == FREE
    slow, fast = pace.join(0, replica=True), pace.join(0, replica=True)
    pace.moved(fast, 3 * WINDOW)
    pace.moved(slow, WINDOW)
    assert pace.fill_end == 2 * WINDOW
    pace.left(slow)
    assert pace.fill_end == 4 * WINDOW
    pace.left(fast)
    assert pace.fill_end == FREE


async def test_a_fill_at_its_limit_waits_until_its_replica_moves():
    pace = Pace()
    replica = pace.join(0, replica=True)
    waiting = asyncio.ensure_future(pace.room(WINDOW))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "a whole window past its replica: it waits"
    pace.moved(replica, 100)
    assert await asyncio.wait_for(waiting, 1) == WINDOW + 100


async def test_a_replica_that_stands_still_holds_the_fill_stall_seconds_at_most(monkeypatch):
    """One wait, ended by its STALL timer running out (no move woke it), and the still replica no longer holds the fill."""
    pace = Pace()
    pace.join(0, replica=True)
    ended = wait_ends(pace, monkeypatch)
    assert await pace.room(WINDOW) == FREE
    assert ended == [("timer", STALL)]


async def test_a_slow_replica_holds_the_fill_hold_seconds_in_all_and_then_it_runs_free():
    clock = Clock()
    pace = Pace(clock=clock)
    replica = pace.join(0, replica=True)
    offset = 0
    while pace.fill_end != FREE:
        offset = pace.fill_end
        waiting = asyncio.ensure_future(pace.room(offset))
        await asyncio.sleep(0)
        clock.now += STALL / 2  # moves every half STALL: never still, always slow
        pace.moved(replica, offset - WINDOW + 1024)
        await waiting
        assert clock.now - 100.0 <= HOLD + STALL, "held past HOLD"
    assert clock.now - 100.0 >= HOLD, "released before HOLD ran out"
    assert await pace.room(offset + (64 << 20)) == FREE


async def test_the_paces_are_per_fill():
    class FillLike:
        pass

    one, other = FillLike(), FillLike()
    pace_of(one).join(0, replica=True)
    assert pace_of(one) is pace_of(one) and pace_of(one).fill_end == WINDOW
    assert pace_of(other).fill_end == FREE


async def test_a_held_stream_asks_for_its_next_chunk_only_once_the_fill_has_room():
    pace = Pace()
    replica = pace.join(0, replica=True)
    asked = []

    async def chunks():
        for i in range(4):
            asked.append(i)
            yield b"x" * WINDOW

    got = []

    async def read():
        async for chunk in held(chunks(), pace):
            got.append(chunk)

    reading = asyncio.ensure_future(read())
    await asyncio.sleep(0.05)
    assert asked == [0], "one window taken: the next waits for the replica"
    pace.moved(replica, WINDOW)
    await asyncio.sleep(0.05)
    assert asked == [0, 1]
    pace.left(replica)
    await asyncio.wait_for(reading, 1)
    assert len(got) == 4


def connected() -> tuple[socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    server.close()
    return client, accepted


def test_a_held_fill_caps_its_receive_buffer_to_its_pace_and_gives_it_back_when_free():
    client, other = connected()
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 128 * 1024)  # within any rmem_max
        before = client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        clock = Clock()
        window = Window(client.fileno(), clock=clock, floor=16 * 1024)
        window.held(0)
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == before, "no pace known yet"
        clock.now += 1.0
        window.held(512 * 1024)  # 512 KiB/s over a loopback round trip: the floor is what flies
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 16 * 1024
        window.free()
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == before
    finally:
        client.close()
        other.close()
