"""The fast path's miss half: a connection leading a plain cold miss's
flight (front/fast_misses.py says which misses, and what is counted), then
sending its answer or handing the connection, with the flight's outcome, to
the handler. A part of `FastPath` (front/fastpath.py), kept apart because a
hit never passes here.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from cachenode.front.exact_head import encode_head
from cachenode.front.fast_misses import FastMisses, Led, Miss
from cachenode.front.plain import PlainRequest
from cachenode.http.headers import end_to_end_pairs

log = structlog.get_logger("nezha.cachenode")
_FAILED = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


LEADING_BACKLOG = 64 * 1024  # bytes of pipelined requests held while a miss is led


class LeadsMisses:
    """What `FastPath` does with a miss `FastMisses.take` accepted."""

    transport: asyncio.Transport | None
    _misses: FastMisses | None
    _serving: asyncio.Task | None
    _leading: bool
    _buf: bytearray
    _write_paused: bool
    waiting_since: float

    def backlog_full(self) -> None:
        """Called with each byte received: stop reading while a led miss has a backlog behind it."""
        if self._leading and len(self._buf) > LEADING_BACKLOG and self.transport is not None:
            self.transport.pause_reading()

    def _lead(self, req: PlainRequest, miss: Miss) -> None:
        """Lead `miss`'s flight. Reading goes on meanwhile (a pause and a resume
        per miss were two epoll_ctl calls): pipelined requests wait in the
        buffer, which stops reading once it holds LEADING_BACKLOG (`backlog_full`)."""
        self._disarm()
        self._leading = True
        self._serving = asyncio.get_running_loop().create_task(self._miss(req, miss))

    async def _miss(self, req: PlainRequest, miss: Miss) -> None:
        """Send the answer of a plain miss's flight, or hand the connection and
        the flight's outcome to the handler. A client gone meanwhile does not
        stop the flight: it is stored for every later request."""
        started = time.monotonic()
        interim = _Interim(self)
        try:
            led = await self._misses.lead(miss, interim=interim)
        except Exception:
            # Not an origin's failure (the engine answers those): a fault here. Its flight is aborted.
            log.exception("fast_miss_failed", key=miss.key)
            if self.transport is not None:
                self.transport.write(_FAILED)
                self.transport.close()
            return
        finally:
            interim.open = False
            self._serving, self._leading = None, False
        ms = (time.monotonic() - started) * 1000
        if isinstance(led, Led):
            if self.transport is None:
                self._misses.unanswered(miss, led, path=req.target, ms=ms)
                return
            self.transport.resume_reading()
            self._hand_off(led=led)
            return
        meta, body = led.meta, led.body
        if self.transport is None:
            self._misses.answered(miss, meta, path=req.target, sent=0, ms=ms, first_byte=None, gone=True)
            return
        del self._buf[:req.size]
        # One write for head and body (asyncio sends it at once when nothing waits before it).
        self.transport.write(self._misses.head(meta) + body)
        if self.transport.is_closing():  # the send failed: the client reset the connection meanwhile
            self._misses.answered(miss, meta, path=req.target, sent=0, ms=ms, first_byte=None, gone=True)
            return
        self._misses.answered(miss, meta, path=req.target, sent=len(body), ms=ms,
                              first_byte=time.monotonic() - started)
        self.waiting_since = time.monotonic()
        if not self._write_paused:
            self.transport.resume_reading()
        self._next()


class _Interim:
    """An origin's interim answers (102, 103) passed on to the client of a
    miss led here, until its final answer is in (as front/interim.py's
    `InterimRelay` for the handler's)."""

    def __init__(self, conn: LeadsMisses) -> None:
        self.conn = conn
        self.open = True

    async def __call__(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        if self.open and self.conn.transport is not None:
            self.conn.transport.write(encode_head(f"HTTP/1.1 {status} {reason}", end_to_end_pairs(headers)))
