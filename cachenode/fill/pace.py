"""The places of the peers reading one fill, and what waits on them: this
node's own clients (front/copies_first.py) and the fill itself.

A fill's clients keep within LEAD of the slowest peer reading it (copies
first). The fill keeps within WINDOW of the slowest of the key's other
owners reading it (`replica`: its replica's streaming copy, or a read the
replica relays): when this node dies mid-fill, the replica's copy goes on
from the origin at the byte it had reached (cluster/streaming_copies.py
`_rest`), and whatever this node had fetched beyond it is fetched again. In
a stampede the fill ran ahead of that copy: the origin sends at O, the
copy gets its share of this node's link beside its pods' reads, and a
killed leader cost the origin 1.03-1.26 S (docs/benchmarks.md, "A fill
kept within a window of its replica's copy").

Held in bytes, bounded in time, so a slow or dead replica never holds a
fill up for long: a replica that has not moved for STALL seconds is not
waited for (dead, stuck, or slower than a piece per STALL), and a fill
waits for its replicas HOLD seconds in all at most, then runs free.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
import weakref
from typing import Any, AsyncIterator, Callable

LEAD = 512 * 1024  # a client's bytes past the slowest peer
STALL = 1.0  # seconds a peer that has not moved is still waited for
WINDOW = 256 * 1024  # the fill's bytes past the slowest replica
HOLD = 10.0  # seconds a fill waits for its replicas in all
FREE = 1 << 62  # no limit


class Pace:
    """The places of the peers reading one fill, and a wake-up for whoever waits on them."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, window: int = WINDOW,
                 hold: float = HOLD) -> None:
        self._clock = clock
        self._window = window
        self._at: dict[int, tuple[int, float]] = {}  # peer reader -> (bytes sent, when it last moved)
        self._replicas: set[int] = set()
        self._moved = asyncio.Event()
        self._count = 0
        self._budget = hold  # seconds the fill may still be held
        # Where the fill may read to now: the one number a pump's thread reads (`HeldBody`).
        self.fill_end = FREE

    def join(self, offset: int, *, replica: bool = False) -> int:
        self._count += 1
        self._at[self._count] = (offset, self._clock())
        if replica:
            self._replicas.add(self._count)
        self._reckon()
        return self._count

    def moved(self, peer: int, offset: int) -> None:
        self._at[peer] = (offset, self._clock())
        self._reckon()
        self._wake()

    def left(self, peer: int) -> None:
        self._at.pop(peer, None)
        self._replicas.discard(peer)
        self._reckon()
        self._wake()

    def allowed(self) -> int | None:
        """Where a client's sending must stop for now: LEAD past the slowest
        peer that moved within STALL; None: no peer to wait for."""
        live = self._live(self._at)
        return min(live) + LEAD if live else None

    def _live(self, peers) -> list[int]:
        now = self._clock()
        return [offset for offset, at in (self._at[p] for p in peers) if now - at < STALL]

    def _reckon(self) -> int:
        """The fill's limit (`fill_end`), set from the replicas that moved within STALL."""
        live = self._live(self._replicas) if self._budget > 0 else []
        self.fill_end = min(live) + self._window if live else FREE
        return self.fill_end

    async def wait(self) -> None:
        """Until a peer moves or leaves, or STALL has passed (a peer that did not move is then not waited for)."""
        moved = self._moved
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STALL):
                await moved.wait()

    async def room(self, offset: int) -> int:
        """Wait while the fill, at `offset`, is WINDOW past its slowest live
        replica; its limit then (FREE: none). The time waited comes off HOLD."""
        while self._reckon() <= offset:
            started = self._clock()
            await self.wait()
            self._budget -= self._clock() - started
        return self.fill_end

    def _wake(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()


_paces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pace_of(fill: Any) -> Pace:
    """The pace of `fill`'s readers (any object a fill's readers share), made by whoever asks first."""
    pace = _paces.get(fill)
    if pace is None:
        pace = _paces[fill] = Pace()
    return pace


PIECE = 256 * 1024  # a peer's bytes per send, so its place moves often enough to pace by
# Bytes a peer's socket may hold not yet sent (TCP_NOTSENT_LOWAT): a send
# returns once they are on their way, so a peer's place is what its link
# carried, give or take what flies, not what its send buffer took (which
# TCP's autotuning grew to megabytes: the clients paced to it ran that far
# ahead of the copy actually sent, and the copy was the slowest stream of its link).
UNSENT = 128 * 1024


class Paced:
    """One sender of a fill's bytes: a peer, whose place the clients pace to,
    or a client, paced. Offsets are the sender's; `base` is where they start
    in what the pace counts (a chunk's first byte in its object, for
    chunks/peers_first.py; 0 for a whole object's fill, front/copies_first.py)."""

    def __init__(self, pace: Pace, *, peer: bool, offset: int, base: int = 0, replica: bool = False) -> None:
        self._pace = pace  # held: a pace kept by weak reference lives while one of its senders does
        self._base = base
        self._peer = pace.join(base + offset, replica=replica) if peer else None

    async def upto(self, offset: int, available: int) -> int:
        """Where this sender may send to from `offset`, of the bytes up to `available`."""
        if self._peer is not None:
            return min(available, offset + PIECE)
        while (allowed := self._pace.allowed()) is not None and allowed <= self._base + offset:
            await self._pace.wait()
        return available if allowed is None else min(available, allowed - self._base)

    def sent(self, offset: int) -> None:
        """This sender's bytes went up to `offset`."""
        if self._peer is not None:
            self._pace.moved(self._peer, self._base + offset)

    def close(self) -> None:
        if self._peer is not None:
            self._pace.left(self._peer)
            self._peer = None

    def __enter__(self) -> "Paced":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def unhurried(transport: Any, *, unsent: int = UNSENT) -> None:
    """Keep at most `unsent` bytes unsent in a peer's socket (`transport`'s),
    so that its place says what left this node, while it is sent a fill or
    a chunk; 0 gives the system's default back (no limit) once it is done:
    a stored object relayed later on the same connection goes out in large sends."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, unsent)


class HeldBody:
    """A spliced body (kernel/splice.py `SocketBody`) whose pump stops where
    its fill's pace says (`Pace.fill_end`, read on the pump's thread) and
    waits there for room; everything else is the body's own.

    While held, its socket's receive buffer is capped (`Window`): else the
    origin keeps what TCP's autotuning gave the window, up to megabytes, in
    flight ahead of the fill, and a dead leader takes those with it too."""

    def __init__(self, body: Any, pace: Pace) -> None:
        self._body = body
        self._pace = pace
        self._window = Window(body.src)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)

    async def pump_into(self, fd: int, offset: int, *, end: Callable[[], int], **kwargs: Any) -> int:
        pace, pos = self._pace, offset
        try:
            while pos < end() and self._body.remaining > 0:
                if pos >= pace.fill_end:
                    self._window.held(pos)
                elif pace.fill_end == FREE:
                    self._window.free()
                await pace.room(pos)
                pos += await self._body.pump_into(fd, pos, end=lambda: min(end(), pace.fill_end), **kwargs)
        finally:
            self._window.free()
        return pos - offset


class Window:
    """The receive buffer of a held fill's socket, which bounds what its
    source has in flight: capped at twice what the fill takes in a round
    trip at the pace it is held to (never below WINDOW), and given back
    (SO_RCVBUF as it was) once the fill runs free.

    Given back is not as before: once SO_RCVBUF is set, the kernel no longer
    grows the buffer with the connection's rate (receive autotuning is off
    for the socket's life), and what is given back is clamped to
    net.core.rmem_max (208 KiB by default: 416 KiB of buffer). A connection
    whose buffer was ever capped (`capped`) must not carry another answer:
    a pooled origin connection would carry every later fill on it at that
    buffer per round trip."""

    def __init__(self, fd: int, *, clock: Callable[[], float] = time.monotonic, floor: int = WINDOW) -> None:
        self._fd = fd
        self._clock = clock
        self._floor = floor
        self._was: int | None = None  # the buffer before the first cap
        self._cap = 0
        self._mark: tuple[int, float] | None = None  # where and when the fill was last held
        self.capped = False  # SO_RCVBUF was set: the socket's buffer no longer follows its rate

    def held(self, pos: int) -> None:
        """The fill, at `pos`, reached its limit: cap the buffer to its pace since it was last held."""
        now = self._clock()
        mark, self._mark = self._mark, (pos, now)
        if mark is None or now <= mark[1]:
            return
        rate = (pos - mark[0]) / (now - mark[1])
        try:
            buffer, rtt = self._get()
            if self._was is None:
                self._was = buffer
            # SO_RCVBUF is doubled by the kernel, half of it a window: given n, n is about what flies.
            cap = min(max(self._floor, int(2 * rate * rtt)), self._was // 2)
            if cap != self._cap:
                self._set(cap)
                self._cap = cap
        except OSError:
            pass  # a closed socket: the pump finds out

    def free(self) -> None:
        self._mark = None
        if self._was is not None:
            with contextlib.suppress(OSError):
                self._set(self._was // 2)  # the kernel doubles what it is given
            self._was, self._cap = None, 0

    def _get(self) -> tuple[int, float]:
        """The socket's receive buffer, and its round trip in seconds (the receiver's estimate, else the sender's)."""
        with socket.socket(fileno=os.dup(self._fd)) as s:
            buffer = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        rtt, rcv_rtt = struct.unpack_from("I", info, 68)[0], struct.unpack_from("I", info, 92)[0]
        return buffer, (rcv_rtt or rtt) / 1e6

    def _set(self, size: int) -> None:
        self.capped = True
        with socket.socket(fileno=os.dup(self._fd)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


async def held(chunks: AsyncIterator[bytes], pace: Pace) -> AsyncIterator[bytes]:
    """`chunks`, each asked for only once the fill has room past the bytes taken so far."""
    taken = 0
    while True:
        await pace.room(taken)
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        taken += len(chunk)
        yield chunk
