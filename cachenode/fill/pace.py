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

import structlog

log = structlog.get_logger("nezha.cachenode")

LEAD = 512 * 1024  # a client's bytes past the slowest peer
STALL = 1.0  # seconds a peer that has not moved is still waited for
WINDOW = 256 * 1024  # the fill's bytes past the slowest replica
HOLD = 10.0  # seconds a fill waits for its replicas in all
AWAIT = 0.5  # seconds from a fill's first read its window is kept within WINDOW, for a replica's read to join
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
        self._joined: list[Callable[[], None]] = []  # told when a replica joins (`watch`)
        # Where the fill may read to now: the one number a pump's thread reads (`HeldBody`).
        self.fill_end = FREE

    def join(self, offset: int, *, replica: bool = False) -> int:
        self._count += 1
        self._at[self._count] = (offset, self._clock())
        if replica:
            self._replicas.add(self._count)
            for call in list(self._joined):
                call()
        self._reckon()
        return self._count

    def watch(self, call: Callable[[], None]) -> None:
        """`call()` whenever a replica joins the fill's pace, and now if one reads it already
        (`Window.joined`: a held fill's buffer is fixed before its window grows)."""
        self._joined.append(call)
        if self._replicas:
            call()

    def unwatch(self, call: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._joined.remove(call)

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

    From a replica's joining on, its socket's receive buffer is fixed and
    then set to the held pace (`Window`): else the origin keeps what TCP's
    autotuning gave the window, up to megabytes, ahead of the fill, and a
    dead leader takes those with it too. Until then, for AWAIT seconds, its
    window is kept within WINDOW (`Window.awaiting`, before each read on
    the pump's thread): a replica's read reached the fill 15-60 ms after
    its first byte in a stampede, when autotuning had already opened
    megabytes, and a window once offered is not taken back."""

    def __init__(self, body: Any, pace: Pace) -> None:
        self._body = body
        self._pace = pace
        self._window = Window(body.src)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)

    async def pump_into(self, fd: int, offset: int, *, end: Callable[[], int], **kwargs: Any) -> int:
        pace, pos = self._pace, offset

        def until() -> int:  # on the pump's thread, before each read
            self._window.awaiting()
            return min(end(), pace.fill_end)

        pace.watch(self._window.joined)
        try:
            while pos < end() and self._body.remaining > 0:
                if pos >= pace.fill_end:
                    self._window.held(pos)
                elif pace.fill_end == FREE:
                    self._window.free()
                await pace.room(pos)
                pos += await self._body.pump_into(fd, pos, end=until, **kwargs)
        finally:
            pace.unwatch(self._window.joined)
            self._window.awaited()
            self._window.free()
        return pos - offset


class Window:
    """The receive buffer of a held fill's socket, which bounds what its
    source has ahead of the fill (in flight and queued unread): fixed when
    a replica first joins the fill's pace (`joined`), before TCP's
    autotuning grows it to megabytes the origin may fill ahead of a leader
    that dies, then set to twice what the fill takes in a round trip at
    the pace it is held to (never below WINDOW), and raised to the most the
    system gives (net.core.rmem_max) once the fill runs free.

    Never lowered below what the socket owes its source (`_owed`: what it
    holds, and the window it last advertised): TCP never takes back a
    window, so a buffer cut below the bytes already allowed in flight makes
    the kernel prune, dropping the origin's segments while the fill is
    held, and the origin's retransmission timer doubled with every drop:
    in a stampede at N = 8 the first owner's origin stood silent 2-14 s,
    and once past `origin_read_timeout`, cutting its clients
    (docs/benchmarks.md, "A held fill's origin silenced by its own
    buffer"). Until a replica joins (for AWAIT seconds at most) the window
    is kept within WINDOW (`awaiting`), so what is owed then is small and
    the pace's buffer is reached at once; from then on what flies is
    bounded apart from what is queued (TCP_WINDOW_CLAMP, to what the pace
    calls for), so a buffer kept for what was owed does not reopen a
    window as large.

    Once SO_RCVBUF is set the kernel no longer grows the buffer with the
    connection's rate (receive autotuning is off for the socket's life). A
    connection whose buffer was set (`capped`) must not carry another
    answer: a pooled origin connection would carry every later fill on it
    at that buffer per round trip."""

    def __init__(self, fd: int, *, clock: Callable[[], float] = time.monotonic, floor: int = WINDOW) -> None:
        self._fd = fd
        self._clock = clock
        self._floor = floor
        self._cap = 0  # what SO_RCVBUF was last set to (the kernel doubles it)
        self._mark: tuple[int, float] | None = None  # where and when the fill was last held
        self._began: float | None = None  # the fill's first read (`awaiting`)
        self._awaited = False  # AWAIT has passed, or the fill is done: the window no longer kept
        self.capped = False  # SO_RCVBUF was set: the socket's buffer no longer follows its rate

    def awaiting(self) -> None:
        """Before a read: keep the window within the floor (TCP_WINDOW_CLAMP)
        for AWAIT seconds from the first, unless a replica joined (the buffer
        is then fixed), and give it back after. Set again before every read:
        autotuning sets the clamp anew each time it grows the buffer. The
        clamp bounds what flies, not what is queued, and does not stop
        autotuning; a fill read as it comes holds little queued."""
        if self.capped or self._awaited:
            return
        now = self._clock()
        if self._began is None:
            self._began = now
        if now - self._began >= AWAIT:
            self.awaited()
            return
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, self._floor)

    def awaited(self) -> None:
        """AWAIT has passed, or the fill is done: the window's bound given back
        to the buffer's, where autotuning keeps it."""
        self._awaited = True
        if self._began is not None and not self.capped:
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP,
                             s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    def joined(self) -> None:
        """A replica joined the fill's pace: fix the buffer now, at WINDOW (or what the socket owes, if more)."""
        if not self.capped:
            self._fix(self._floor)

    def held(self, pos: int) -> None:
        """The fill, at `pos`, reached its limit: set the buffer to its pace since it was last held."""
        now = self._clock()
        mark, self._mark = self._mark, (pos, now)
        if mark is None or now <= mark[1]:
            if not self.capped:
                self._fix(self._floor)
            return
        rate = (pos - mark[0]) / (now - mark[1])
        with contextlib.suppress(OSError):  # a closed socket: the pump finds out
            # SO_RCVBUF is doubled by the kernel, half of it a window: given n, n is about what flies.
            self._fix(max(self._floor, int(2 * rate * self._rtt())))

    def free(self) -> None:
        self._mark = None
        if self.capped:
            with contextlib.suppress(OSError):
                given = rmem_max()
                if given > self._cap:
                    self._set(given)

    def _fix(self, want: int) -> None:
        """SO_RCVBUF to `want`, lowered no further than what the socket owes its source."""
        try:
            if not self.capped:
                self._cap = self._get(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2  # where the kernel has it now
            owed = 0 if want >= self._cap else self._owed()
            size = want if want >= self._cap else max(want, min(self._cap, owed))
            log.debug("fill_window_set", was=self._cap, want=want, owed=owed, set=size)
            self._set(size, want)
        except OSError:
            pass  # a closed socket: the pump finds out

    def _owed(self) -> int:
        """What SO_RCVBUF must keep so the kernel drops nothing: the memory its
        queues hold, and the window it last advertised (at most half payload
        in memory), of which the kernel's buffer is twice SO_RCVBUF."""
        with socket.socket(fileno=os.dup(self._fd)) as s:
            held = struct.unpack_from("I", s.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * 9))[0]
            window = struct.unpack_from("I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO), _RCV_WND)[0]
        # A shut window owes nothing: what is queued stays, and the window
        # stays shut until the fill has read below the new buffer.
        return held // 2 + window if window else 0

    def _rtt(self) -> float:
        """The socket's round trip in seconds (the receiver's estimate, else the sender's)."""
        with socket.socket(fileno=os.dup(self._fd)) as s:
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        rtt, rcv_rtt = struct.unpack_from("I", info, 68)[0], struct.unpack_from("I", info, 92)[0]
        return (rcv_rtt or rtt) / 1e6

    def _get(self, level: int, option: int) -> int:
        with socket.socket(fileno=os.dup(self._fd)) as s:
            return s.getsockopt(level, option)

    def _set(self, size: int, window: int | None = None) -> None:
        """SO_RCVBUF to `size`, and the window's bound (TCP_WINDOW_CLAMP) to
        `window` (None: the whole buffer's): what is queued and what flies
        are bounded apart, so the buffer kept for what the socket owes does
        not open a window that large again. The clamp is set with the buffer
        in any case: it follows the buffer only while autotuning grows it,
        and fixed at the first 128 KiB it stays at 117,248 bytes."""
        self.capped = True
        with socket.socket(fileno=os.dup(self._fd)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
            buffer = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)  # doubled, and clamped to rmem_max
            self._cap = buffer // 2
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, buffer if window is None else window)


SO_MEMINFO = 55  # socket(7): the socket's memory, first what its receive queues hold
_RCV_WND, _INFO = 232, 236  # tcp_info's tcpi_rcv_wnd (Linux 6.2): the window last advertised


def rmem_max() -> int:
    """The most SO_RCVBUF may be set to (net.core.rmem_max)."""
    with open("/proc/sys/net/core/rmem_max") as f:
        return int(f.read())


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
