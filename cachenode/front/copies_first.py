"""Copies first: on a fill that another node reads (a streaming copy, a
relayed read), this node's own clients stay at most LEAD bytes ahead of the
slowest such peer.

In a stampede each node's link carries its own pods' reads and the stream
that feeds the next node's copy (cluster/streaming_copies.py), and every
pod of every node behind waits on that stream. TCP shares the link per
connection, and the copy lost it to the pods: on two nodes the first
owner's four pods had their 8 MiB in 3.1-4.8 s while the copy took 5.4 s,
and the other node's four pods, fed by it, ended at 6.3 s (docs/
benchmarks.md, "Stampede"). A pod ahead of the copy gains the wave nothing.
So a client's read of a fill waits while it is LEAD past the slowest peer
reading the same fill; the link then goes to the copy first, and the pods
here still end when the link has sent its bytes.

A peer that has not moved for STALL seconds (dead, stuck, or slower than
PIECE per STALL) is not waited for, so a slow peer costs a client here at
most STALL at a time, never its read. A peer's sends are cut to PIECE, so
its place moves often enough to pace by.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Callable

LEAD = 512 * 1024
STALL = 1.0
PIECE = 256 * 1024


class Pace:
    """The places of the peers reading one fill, and a wake-up for the clients waiting on them."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._at: dict[int, tuple[int, float]] = {}  # peer reader -> (bytes sent, when it last moved)
        self._moved = asyncio.Event()
        self._count = 0

    def join(self, offset: int) -> int:
        self._count += 1
        self._at[self._count] = (offset, self._clock())
        return self._count

    def moved(self, peer: int, offset: int) -> None:
        self._at[peer] = (offset, self._clock())
        self._wake()

    def left(self, peer: int) -> None:
        self._at.pop(peer, None)
        self._wake()

    def allowed(self) -> int | None:
        """Where a client's sending must stop for now: LEAD past the slowest
        peer that moved within STALL; None: no peer to wait for."""
        now = self._clock()
        live = [offset for offset, at in self._at.values() if now - at < STALL]
        return min(live) + LEAD if live else None

    async def wait(self) -> None:
        """Until a peer moves or leaves, or STALL has passed (a peer that did not move is then not waited for)."""
        moved = self._moved
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STALL):
                await moved.wait()

    def _wake(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()


class Paced:
    """One reader of a fill: a peer, whose place the clients pace to, or a client, paced."""

    def __init__(self, pace: Pace, *, peer: bool, offset: int) -> None:
        self._pace = pace
        self._peer = pace.join(offset) if peer else None

    async def upto(self, offset: int, available: int) -> int:
        """Where this reader may send to from `offset`, of the bytes up to `available`."""
        if self._peer is not None:
            return min(available, offset + PIECE)
        while (allowed := self._pace.allowed()) is not None and allowed <= offset:
            await self._pace.wait()
        return available if allowed is None else min(available, allowed)

    def sent(self, offset: int) -> None:
        if self._peer is not None:
            self._pace.moved(self._peer, offset)

    def close(self) -> None:
        if self._peer is not None:
            self._pace.left(self._peer)
            self._peer = None


_paces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reader(fill: object, *, peer: bool, offset: int) -> Paced:
    """A reader of `fill` (any object a fill's readers share), paced with its other readers."""
    pace = _paces.get(fill)
    if pace is None:
        pace = _paces[fill] = Pace()
    return Paced(pace, peer=peer, offset=offset)
