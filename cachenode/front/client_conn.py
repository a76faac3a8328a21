"""aiohttp's per-connection handler, taught four things a cache must do.

- A client that half-closes (`shutdown(SHUT_WR)` after its last request, as
  HTTP/1.0-style tools and some proxies do) still gets every answer: aiohttp
  lets the transport close on EOF, which dropped the responses not yet
  written. Here EOF only means "no more requests": those already received
  are answered, then the connection closes. A request body the EOF cut short
  cannot be answered, and the connection is closed as before.
- A request head must arrive within `head_timeout` (408, then close), so
  trickled heads cannot hold descriptors for the hour an idle keep-alive
  connection may stay open.
- A malformed request is one structured log line, not a traceback on
  stderr per bad client.
- A connection the fast path handed over for one plain request goes back
  to it once that request is answered at a clean boundary (`back`), so a
  keep-alive client's next requests are the fast path's again (aiohttp's
  server, middlewares and handler cost about 270 us more a request,
  docs/benchmarks.md "Cold misses led on the fast path"). Clean
  means aiohttp's parser never read a byte past the request (no body, no
  request behind it) and the answer is whole, so no byte is read by both
  parsers (front/fastpath.py).

It also registers with the node's connection `Gate`, which may reclaim it
while it only waits for a request. What aiohttp does not expose is read from
its handler's state (`_waiter`, `_messages`, `_current_request`, and for
going back `_force_close`, `_task_handler`, `_paused`, `_upgraded`); the tests
in tests/integration/cachenode/test_connections.py and test_fastpath_back.py
fail if a new aiohttp changes them.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from cachenode.front.connections import Gate, HeadTimer, head_timeout_response

log = structlog.get_logger("nezha.connections")


class ClientConnection(RequestHandler):
    # True for a connection whose TLS a follower worker ended and passes on in
    # the clear (cachenode/workers/): its requests are https, though this
    # process sees no TLS.
    secure = False
    # The flight the fast path led for this connection's first request, which
    # the handler answers (front/fast_misses.py `Led`, `take_led`).
    led = None
    # The fast path (front/fastpath.py `FastPath`) this connection goes back to
    # once its one request is answered, while that request is all it has
    # received; dropped at any byte or end after it.
    back = None

    def __init__(self, manager, *, gate: Gate, head_timeout: float, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._gate = gate
        self._head_timeout = head_timeout
        self._head_timer = HeadTimer(head_timeout, self._head_timed_out)
        self._eof_seen = False
        self._partial = False  # bytes received since the last complete request head
        self._since = time.monotonic()
        self._returning = False  # going `back`: aiohttp's task is ending, what comes meanwhile is held
        self._held = bytearray()
        self._held_eof = False

    # -- what the gate asks ----------------------------------------------------
    @property
    def waiting(self) -> bool:
        return self._parked() and not self._eof_seen

    @property
    def waiting_since(self) -> float:
        return self._since

    def reclaim(self) -> None:
        self.force_close()

    def _parked(self) -> bool:
        """start() is waiting for a request and none is queued."""
        return self._waiter is not None and not self._waiter.done() and not self._messages

    # -- connection events -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._gate.enter(self)
        self._arm()  # from connecting: a connection that never sends a head is timed too

    def connection_lost(self, exc: BaseException | None) -> None:
        self._gate.leave(self)
        self._disarm()
        if self.led is not None:  # gone before its request reached the handler
            self.led.release()
            self.led = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._returning:
            self._held += data
            return
        if data:
            self.back = None  # a byte beyond the request handed here: aiohttp's to parse, for good
        queued = len(self._messages)
        super().data_received(data)
        if len(self._messages) > queued:
            self._partial = False
            self._disarm()
        elif data:
            self._partial = True
            self._arm()

    def eof_received(self) -> bool:
        if self._returning:
            self._held_eof = True
            return True  # the fast path answers what was held, then closes
        self.back = None
        self._eof_seen = True
        # After the handler of a request already popped has taken its first
        # step (FIFO callbacks): only then is that request visible here.
        self._loop.call_soon(self._after_eof)
        # Keep the transport: answers may still be owed. TLS has no half-close
        # (asyncio closes an SSL transport at the peer's EOF whatever we say).
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def _after_eof(self) -> None:
        if self.transport is None:
            return
        payloads = [p for _, p in self._messages]
        if self._current_request is not None:
            payloads.append(self._current_request.content)
        if any(not p.is_eof() for p in payloads):
            log.info("request_body_cut", reason="client closed its side before the body ended")
            self.force_close()
        elif self._parked():
            self.force_close()  # nothing owed: every request received has been answered

    async def finish_response(self, request, resp, start_time):
        result = await super().finish_response(request, resp, start_time)
        self._partial = False  # bytes that came with the request were its body
        self._disarm()  # from here the wait is keep-alive's, until a next head begins
        self._since = time.monotonic()
        if self._eof_seen and not self._messages:
            self.close()  # the client sends nothing more: close once this answer is out
        elif self.back is not None and self._answered_whole(request, *result):
            # start() leaves its loop after this answer without closing the
            # transport (aiohttp's own way out once it has been given one) and
            # the connection goes back (`start`).
            self._returning = self._force_close = True
        return result

    def _answered_whole(self, request, resp, reset: bool) -> bool:
        """The request the fast path handed here is answered at a clean
        boundary: the whole answer written with keep-alive, no body left to
        read, nothing queued or half-parsed behind it, nothing paused."""
        transport = self.transport
        return (not reset and resp.keep_alive and not self._close and not self._force_close
                and not self._messages and not self._upgraded and self._payload_parser is None
                and not self._paused and self.led is None and request.content.is_eof()
                and transport is not None and not transport.is_closing() and transport.is_reading())

    async def start(self) -> None:
        """aiohttp's read loop; then, for a connection answered whole
        (`_answered_whole`), back to the fast path, once the loop has ended."""
        try:
            await super().start()
        except BaseException:
            if self._returning:
                self.force_close()  # cancelled at shutdown: nobody takes it back
            raise
        if self._returning:
            self._give_back()

    def _give_back(self) -> None:
        """aiohttp's own cleanup of a connection gone (out of its server, the
        gate, its timers), with no transport for it to close; then the fast path's."""
        fast, self.back, self._returning = self.back, None, False
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # the client went away meanwhile: connection_lost has it
        if self._close:
            self.force_close()  # the server is shutting down (aiohttp's pre_shutdown): not given back to close
            return
        self._task_handler = None  # ended: aiohttp's Server forgets this handler at once
        self.transport = None  # so aiohttp's cleanup below closes nothing
        self.connection_lost(None)
        fast.take_back(transport, bytes(self._held), self._held_eof)

    # -- the head timer ----------------------------------------------------------
    def _arm(self) -> None:
        self._head_timer.arm()

    def _disarm(self) -> None:
        self._head_timer.disarm()

    def _head_timed_out(self) -> None:
        if self.transport is None:
            return
        if not self._parked():
            if self._partial:
                self._arm()  # a request is being answered; the next head is timed once it is done
            return
        if self._partial:
            self.transport.write(head_timeout_response(self._head_timeout))
        log.info("request_head_timeout", seconds=self._head_timeout, partial=self._partial)
        self.force_close()

    # -- errors ------------------------------------------------------------------
    def log_exception(self, *args, **kw) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            log.info("bad_request", status=exc.code, reason=(exc.message or "").strip().split("\n")[0][:200])
            return
        super().log_exception(*args, **kw)
