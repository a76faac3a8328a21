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
SHUT_POLL = 0.05  # seconds between a held fill's looks at whether its window is shut (`Window.shut`)


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
        self._window = Window(body.src, shut_first=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)

    async def pump_into(self, fd: int, offset: int, *, end: Callable[[], int], **kwargs: Any) -> int:
        pace, pos = self._pace, offset
        try:
            while pos < end() and self._body.remaining > 0:
                if pos >= pace.fill_end:
                    self._window.held(pos)
                    await room_held(pace, pos, self._window)
                else:
                    if pace.fill_end == FREE:
                        self._window.free()
                    await pace.room(pos)
                pos += await self._body.pump_into(fd, pos, end=lambda: min(end(), pace.fill_end), **kwargs)
        finally:
            self._window.free()
        return pos - offset

async def room_held(pace: Pace, pos: int, window: "Window") -> None:
    """`pace.room(pos)` for a fill held at `pos`, `window` asked every
    SHUT_POLL seconds meanwhile to lower its buffer, until it has (or the
    fill has room again): it may only once the socket's window is shut."""
    room = asyncio.ensure_future(pace.room(pos))
    try:
        while window.shut() and not room.done():
            await asyncio.wait({room}, timeout=SHUT_POLL)
        await room
    finally:
        room.cancel()


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
    buffer per round trip.

    A spliced fill's (`HeldBody`, `shut_first`) is lowered only once the
    socket owes its source nothing (`shut`: the window it advertised is
    used up): TCP never takes back a window, so a
    buffer cut below the bytes already allowed in flight makes the kernel
    prune, dropping the origin's segments (its out-of-order queue too)
    while the fill is held. The origin then retransmitted on its timer,
    each retransmission dropped until the fill moved, the timer doubling
    every time: in a stampede at N = 8 the first owner's origin stood
    silent 2-14 s after its fill was let go, and once past 30 s, when the
    fill's read timeout (`origin_read_timeout`) took the held, healthy fill
    for a dead origin and cut its clients (docs/benchmarks.md, "A held
    fill's origin silenced by its own buffer"). Lowered with the window
    shut, the kernel keeps every queued byte and keeps the window shut
    until the fill has read below the new size: nothing is dropped. A
    chunk's origin fill, read through aiohttp (chunks/landing.py), is
    still lowered at once: aiohttp drains the socket into its own buffer,
    and with a 4 MiB chunk on 127.0.0.1 the window never shut before the
    whole chunk was in (tests/integration/cachenode/test_chunk_held_connection.py).
    """

    def __init__(self, fd: int, *, clock: Callable[[], float] = time.monotonic, floor: int = WINDOW,
                 shut_first: bool = False) -> None:
        self._fd = fd
        self._shut_first = shut_first  # lowered only once the window is shut (`shut`); else at once, as before
        self._clock = clock
        self._floor = floor
        self._was: int | None = None  # the buffer before the first cap
        self._cap = 0  # what SO_RCVBUF was last set to
        self._want = 0  # what the pace calls for, set once the window is shut
        self._mark: tuple[int, float] | None = None  # where and when the fill was last held
        self.capped = False  # SO_RCVBUF was set: the socket's buffer no longer follows its rate

    def held(self, pos: int) -> None:
        """The fill, at `pos`, reached its limit: the buffer its pace since it was last held calls for,
        set once the window is shut (`shut`)."""
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
            self._want = min(max(self._floor, int(2 * rate * rtt)), self._was // 2)
        except OSError:
            return  # a closed socket: the pump finds out
        self.shut()

    def shut(self) -> bool:
        """Lower the buffer to what the pace calls for if the socket owes its
        source nothing now; whether a lower buffer is still to be set (the
        held pump asks again while it waits)."""
        if not self._want or self._want == self._cap:
            return False
        try:
            if self._shut_first and not owes_nothing(self._fd):
                return True
            self._set(self._want)
            self._cap = self._want
        except OSError:
            pass  # a closed socket: the pump finds out
        return False

    def free(self) -> None:
        self._mark, self._want = None, 0
        if self._was is not None:
            with contextlib.suppress(OSError):
                # The kernel doubles what it is given, clamped to rmem_max: never below the buffer it has now.
                given = min(self._was // 2, rmem_max())
                if self._cap and given > self._cap:
                    self._set(given)
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


_RCV_WND = 232  # tcp_info's tcpi_rcv_wnd: the window last advertised


def owes_nothing(fd: int) -> bool:
    """Whether the socket `fd` advertised its source no window it has not
    filled (tcpi_rcv_wnd 0): a lower buffer then drops nothing. False where
    the kernel does not say (a TCP_INFO without tcpi_rcv_wnd): never lowered there."""
    with socket.socket(fileno=os.dup(fd)) as s:
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _RCV_WND + 4)
    return len(info) >= _RCV_WND + 4 and struct.unpack_from("I", info, _RCV_WND)[0] == 0


_rmem_max: int | None = None


def rmem_max() -> int:
    """net.core.rmem_max, which SO_RCVBUF is clamped to (Linux's default where it cannot be read)."""
    global _rmem_max
    if _rmem_max is None:
        try:
            _rmem_max = int(open("/proc/sys/net/core/rmem_max").read())
        except (OSError, ValueError):
            _rmem_max = 212992
    return _rmem_max
