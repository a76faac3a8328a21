"""Zero-copy moves of bodies: a peer's response body into the client's
socket (`splice_body`), both ways between two sockets (`splice_both`, the
TLS port's pass-through relay), and a response body into a fill's file
(`SocketBody`, for every fill from an origin or a peer over plain TCP).

A relay that reads the owner's body into Python and writes it out again
copies every byte twice in user space; on a small machine that halves the
relay's throughput next to the owner's sendfile. `os.splice` moves the bytes
socket -> pipe -> socket inside the kernel instead.

Only used when it is safe: plain TCP on both sides (never TLS, whose bytes
must be transformed), a known body length, and nothing queued in the
client's transport. The upstream connection is closed afterwards, never
returned to the pool, because aiohttp's parser did not see the body.
The sockets are driven through duplicated descriptors: asyncio refuses
readers and writers on descriptors its transports own.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import aiohttp
import structlog
from aiohttp import web

from cachenode.kernel.fdwait import ready

log = structlog.get_logger("nezha.fill")

PIPE_SIZE = 1 << 20
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
AVAILABLE = hasattr(os, "splice")


class BrokenStream(Exception):
    """A body could not be completed; the connection was closed on purpose."""


class ClientGone(ConnectionError):
    """The client closed its connection (its socket stopped taking bytes) mid-body,
    after `sent` bytes of the current write left; not the fault of the source
    being read. One class for every writer to a client socket: a relay's
    splice here, a stored object's sendfile (`front/respond.py`)."""

    def __init__(self, message: str, *, sent: int = 0) -> None:
        super().__init__(message)
        self.sent = sent


def usable(response: aiohttp.ClientResponse, request: web.Request) -> bool:
    if not AVAILABLE or response.content_length is None or request.transport is None:
        return False
    conn = response.connection
    if conn is None or conn.transport is None:
        return False
    for transport in (conn.transport, request.transport):
        if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("socket") is None:
            return False
    return True


def takeable(response: aiohttp.ClientResponse) -> bool:
    """Whether `response`'s body can be taken off its socket by splice: plain
    TCP, framed by Content-Length alone (never chunked, never TLS), on
    asyncio's own loop: `_take` must disable the transport's
    resume_reading, an attribute uvloop's transports make read-only, so
    there fills keep aiohttp's reader."""
    if not AVAILABLE or response.content_length is None or "Transfer-Encoding" in response.headers:
        return False
    if not isinstance(asyncio.get_running_loop(), asyncio.selector_events.BaseSelectorEventLoop):
        return False
    if _taken >= MAX_PUMPS:
        return False
    conn = response.connection
    if conn is None or conn.transport is None:
        return False
    return conn.transport.get_extra_info("sslcontext") is None and conn.transport.get_extra_info("socket") is not None


def _drain(response: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The bytes aiohttp already holds of `response`'s body, and whether they
    are all of it.

    Draining the buffer can let aiohttp's parser resume and reach the end
    of the body: the rest is then in the buffer too (taken here), and the
    connection is back in aiohttp's pool, no longer the body's to take.
    """
    buffered = response.content.read_nowait(-1)
    if not response.content.is_eof():
        return buffered, False
    while more := response.content.read_nowait(-1):
        buffered += more
    return buffered, True


def _take(transport: asyncio.Transport) -> None:
    """Stop `transport` reading for the rest of its life (it is closed after the splice).

    Pausing alone is not enough: aiohttp pools connections, and the reader of
    a previous response on this connection (a replication copy still draining
    its buffer after the connection went back to the pool) may call
    `resume_reading()` on it later. A resumed transport would swallow the
    bytes being spliced into a buffer nobody reads, and the relay would wait
    for them until its read timeout.
    """
    transport.pause_reading()
    transport.resume_reading = lambda: None  # type: ignore[method-assign]


async def _send_buffered(out: web.StreamResponse, buffered: bytes, on_bytes: Callable[[int], None]) -> None:
    """Write bytes aiohttp had already parsed the usual way, and count them."""
    try:
        if buffered:
            await out.write(buffered)
    except ConnectionError as e:
        raise ClientGone(f"client socket: {e}") from e
    on_bytes(len(buffered))


async def splice_body(response: aiohttp.ClientResponse, request: web.Request, out: web.StreamResponse, *,
                      read_timeout: float, on_bytes: Callable[[int], None]) -> None:
    """Send the rest of `response`'s body to the client.

    Raises aiohttp.ClientPayloadError (or asyncio.TimeoutError) when the
    owner fails mid-body, so the caller can resume elsewhere; ClientGone when
    the client does.
    """
    conn = response.connection
    assert conn is not None and conn.transport is not None and request.transport is not None
    upstream = conn.transport
    remaining = response.content_length or 0
    # Bytes aiohttp already parsed into the response's buffer go the usual
    # way. Taking them can make aiohttp resume reading the socket, so the
    # transport is paused only after, with no await in between: from then on
    # every byte on the socket is ours to splice.
    buffered, whole = _drain(response)
    if whole:
        await _send_buffered(out, buffered, on_bytes)
        return
    _take(upstream)
    if buffered:
        await _send_buffered(out, buffered, on_bytes)
        remaining -= len(buffered)
    while request.transport.get_write_buffer_size():
        await asyncio.sleep(0.001)
    src = os.dup(upstream.get_extra_info("socket").fileno())
    dst = os.dup(request.transport.get_extra_info("socket").fileno())
    pipe_r, pipe_w = os.pipe()
    try:
        try:
            fcntl.fcntl(pipe_w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
        except OSError:
            pass  # the default 64 KiB pipe works, only with more calls
        while remaining > 0:
            try:
                n = os.splice(src, pipe_w, min(remaining, PIPE_SIZE), flags=_FLAGS)
            except BlockingIOError:
                await ready(src, timeout=read_timeout)
                continue
            except OSError as e:
                raise aiohttp.ClientPayloadError(f"peer socket: {e}") from e
            if n == 0:
                raise aiohttp.ClientPayloadError(f"peer closed with {remaining} bytes to go")
            left = n
            while left:
                try:
                    left -= os.splice(pipe_r, dst, left, flags=_FLAGS)
                except BlockingIOError:
                    await ready(dst, write=True, timeout=read_timeout)
                except OSError as e:
                    raise ClientGone(f"client socket: {e}") from e
            remaining -= n
            on_bytes(n)
    finally:
        for fd in (src, dst, pipe_r, pipe_w):
            os.close(fd)
        response.close()  # the parser never saw these bytes: the connection cannot be reused


async def splice_both(a: socket.socket, b: socket.socket) -> tuple[int, int]:
    """Move bytes a -> b and b -> a inside the kernel until both directions ended;
    returns (bytes a -> b, bytes b -> a).

    For connections this process owns outright (no transport reads them): the
    TLS port's relay, whose bytes are never looked at. An end of one side is
    passed on as a half-close (shutdown for writing), so a client that shuts
    down after its request still gets the whole answer; a reset or error on
    either side ends both.
    """

    def end_both() -> None:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    async def one_way(src: socket.socket, dst: socket.socket) -> int:
        moved = 0
        pipe_r, pipe_w = os.pipe()
        try:
            try:
                fcntl.fcntl(pipe_w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
            except OSError:
                pass
            while True:
                try:
                    n = os.splice(src.fileno(), pipe_w, PIPE_SIZE, flags=_FLAGS)
                except BlockingIOError:
                    await ready(src.fileno())
                    continue
                if n == 0:
                    break
                left = n
                while left:
                    try:
                        left -= os.splice(pipe_r, dst.fileno(), left, flags=_FLAGS)
                    except BlockingIOError:
                        await ready(dst.fileno(), write=True)
                moved += n
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        except OSError:
            end_both()
        finally:
            os.close(pipe_r)
            os.close(pipe_w)
        return moved

    up, down = await asyncio.gather(one_way(a, b), one_way(b, a))
    return up, down


# Threads that move fill bodies (SocketBody.pump_into): one per stream for
# the length of its transfer, so never the loop's default executor, whose
# few workers the store's short steps (open, commit, unlink) must find free.
# At most MAX_PUMPS bodies are taken at once (a slot is held from
# SocketBody() until its descriptors are closed, after its thread ended);
# beyond that, `takeable` says no and the fill keeps aiohttp's reader: a
# pump never waits in the pool's queue while its socket goes unread,
# whatever number of slow fills a node runs.
MAX_PUMPS = 256
_PUMPS = ThreadPoolExecutor(max_workers=MAX_PUMPS, thread_name_prefix="nezha-fill")
_taken = 0
_TICK = 0.5  # seconds a pump waits on a quiet socket before looking at its stop flag again


def take(response: aiohttp.ClientResponse) -> "SocketBody | None":
    """The response's body for a pump, or None when it must be read through
    aiohttp: not takeable (see `takeable`), or no descriptor left for the
    duplicate and the pipe (logged)."""
    if not takeable(response):
        return None
    try:
        return SocketBody(response)
    except OSError as e:
        log.warning("splice_unavailable", reason=f"{type(e).__name__}: {e}", fallback="aiohttp reader")
        return None


class FileWriteFailed(OSError):
    """The file side of a pump failed (ENOSPC, EIO...) at offset `at`; every
    byte before it was reported as moved."""

    def __init__(self, error: OSError, at: int) -> None:
        super().__init__(error.errno, error.strerror)
        self.at = at


class SocketBody:
    """The rest of a response's body, moved off its socket into a file by the
    kernel (`pump_into`: socket -> pipe -> file): no byte of it passes
    through Python.

    A fill through aiohttp's reader copies every byte into a bytes object
    and out again to the file, and costs the event loop a wake-up per
    socket read; on a small machine that loop is what holds a cold fill
    back. Bytes aiohttp had already read are handed over first
    (`buffered`). The response is closed at the end, never reused: its
    parser did not see the body.
    """

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        """Raises OSError (no descriptor left) before touching the response:
        the caller reads it through aiohttp instead."""
        conn = response.connection
        assert conn is not None and conn.transport is not None and response.content_length is not None
        self.src = os.dup(conn.transport.get_extra_info("socket").fileno())
        try:
            self.pipe_r, self.pipe_w = os.pipe()
        except OSError:
            os.close(self.src)
            raise
        global _taken
        _taken += 1  # given back by close(), or when a pump still running then ends
        self._held = True
        self.response = response
        transport = conn.transport
        self.buffered, whole = _drain(response)  # before pausing: see splice_body
        if whole:
            self.remaining = 0
        else:
            _take(transport)
            self.remaining = response.content_length - len(self.buffered)  # still on the socket
        self.in_pipe = 0
        self.stop = threading.Event()  # a pump's caller was cancelled
        self.pumping: asyncio.Future | None = None
        try:
            fcntl.fcntl(self.pipe_w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
        except OSError:
            pass
        try:  # what the pipe holds: a pump never asks for more, so its blocking splice never waits on a full pipe
            self.capacity = fcntl.fcntl(self.pipe_w, getattr(fcntl, "F_GETPIPE_SZ", 1032))
        except OSError:
            self.capacity = 64 * 1024  # Linux's default

    async def pump_into(self, fd: int, offset: int, *, end: Callable[[], int], moved: Callable[[int], None],
                        read_timeout: float, started: Callable[[asyncio.Future], None] | None = None,
                        landed: Callable[[int], None] | None = None) -> int:
        """Move the body from the socket into `fd` at `offset` on a thread of
        its own, by blocking splice socket -> pipe -> file, until `end()` (an
        offset: a slice's end) or the body's end.
        `moved(n)` is called on the loop as bytes reach the file, `landed(n)`
        on the pump's own thread (for work that must not wait for the loop,
        or run on it: cachenode/store/writeback.py). Returns the
        bytes moved; raises ClientPayloadError or TimeoutError for the
        socket, FileWriteFailed for the file (the bytes left in the pipe are
        still readable by `rest`).

        One blocking thread per stream measured 2-3 GB/s at 0.34-0.5 CPU s
        per GiB here, against 1-6 CPU s for splices driven by the loop: a
        non-blocking splice takes whatever the socket holds (often 64 KiB)
        and every wait costs two epoll_ctl calls and a wake-up.
        """
        loop = asyncio.get_running_loop()

        def on_thread(n: int) -> None:
            loop.call_soon_threadsafe(moved, n)  # first: the bytes are in the file whatever follows
            if landed is not None:
                landed(n)
        job = loop.run_in_executor(_PUMPS, self._pump, fd, offset, end, on_thread, read_timeout)
        self.pumping = job
        if started is not None:
            started(job)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            self.stop.set()  # the thread ends within a tick; close() waits for it
            raise
        except (ConnectionError, OSError) as e:
            if isinstance(e, (FileWriteFailed, TimeoutError)):
                raise
            raise aiohttp.ClientPayloadError(f"socket: {e}") from e

    def _pump(self, fd: int, offset: int, end: Callable[[], int], moved: Callable[[int], None],
              read_timeout: float) -> int:
        pos = offset
        probe = socket.socket(fileno=os.dup(self.src))
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(_TICK), int(_TICK % 1 * 1e6)))
            os.set_blocking(self.src, True)
            quiet = 0.0
            while not self.stop.is_set():
                want = min(end() - pos, self.remaining, self.capacity)
                if want <= 0:
                    break
                try:
                    n = os.splice(self.src, self.pipe_w, want)
                except (BlockingIOError, TimeoutError, InterruptedError):
                    quiet += _TICK
                    if quiet >= read_timeout:
                        raise TimeoutError(f"socket silent for {read_timeout:g}s with {self.remaining} bytes to go")
                    continue
                if n == 0:
                    raise ConnectionError(f"the peer closed with {self.remaining} bytes to go")
                quiet = 0.0
                self.remaining -= n
                self.in_pipe += n
                while self.in_pipe:
                    try:
                        w = os.splice(self.pipe_r, fd, self.in_pipe, offset_dst=pos)
                    except OSError as e:
                        raise FileWriteFailed(e, pos) from e
                    if w == 0:
                        raise FileWriteFailed(OSError(errno.EIO, "the file took no bytes"), pos)
                    pos += w
                    self.in_pipe -= w
                    moved(w)
            return pos - offset
        finally:
            os.set_blocking(self.src, False)
            probe.close()

    async def rest(self, *, read_timeout: float, size: int = PIPE_SIZE):
        """The bytes not yet moved into a file, through Python: what the pipe
        holds, then the socket's (for a fill whose store stopped taking them)."""
        while self.in_pipe:
            data = os.read(self.pipe_r, self.in_pipe)
            self.in_pipe -= len(data)
            yield data
        while self.remaining:
            try:
                data = os.read(self.src, min(size, self.remaining))
            except BlockingIOError:
                await ready(self.src, timeout=read_timeout)
                continue
            except OSError as e:
                raise aiohttp.ClientPayloadError(f"socket: {e}") from e
            if not data:
                raise aiohttp.ClientPayloadError(f"the peer closed with {self.remaining} bytes to go")
            self.remaining -= len(data)
            yield data

    def close(self) -> None:
        """Close the response now, the descriptors once a pump still running
        (its caller was cancelled) has ended: a descriptor closed under a
        thread may be reused by another file."""
        self.response.close()
        self.stop.set()
        if self.pumping is not None and not self.pumping.done():
            self.pumping.add_done_callback(lambda _: self._close_fds())
        else:
            self._close_fds()

    def _release(self) -> None:
        global _taken
        if self._held:
            self._held = False
            _taken -= 1

    def _close_fds(self) -> None:
        """The last step, once no thread uses the body: its slot is free again."""
        for fd in (self.src, self.pipe_r, self.pipe_w):
            os.close(fd)
        self._release()
