"""Small answers to body-less GETs of plain http:// origins, read by the
node on its own keep-alive connections: the origin exchange of a cold small
fill the fast path leads (front/fast_misses.py), without aiohttp.

Why: through aiohttp (fill/plain_get.py, its connector, `ResponseHandler`,
`ClientResponse`, `StreamReader` and their timers) a 16 KiB GET costs the
node about 50 us of CPU, against about 22 us for a protocol making the same
system calls (docs/benchmarks.md, 2026-11-29). A dataset's first epoch is
mostly such GETs, and their answers are the plainest HTTP there is: a 200
with a Content-Length, read whole into memory, stored at once.

So this client answers only that case and declines everything else (None):
a 1xx (the engine's path forwards 102 and 103 to the client), any other
status, no or a bad or a too large Content-Length, Transfer-Encoding, a
head it cannot read plainly, a connection that fails, closes or stays
silent before the body is whole, or every connection of its pool to that
origin busy. A decline means nothing was stored, and the caller asks again
through the engine (aiohttp) as before: the request is a GET without a body,
safe to repeat (RFC 9110 §9.2.2), and the caller only comes here for an
origin whose recent fills were small (fill/recent_fills.py), so a decline
after the request went out is rare. A silent origin is asked twice, so its
504 comes after twice the read timeout; a follower's lead
(workers/follower_leads.py) declines the same way.

A connection is reused only when its answer allows (HTTP/1.1 without
`Connection: close`, HTTP/1.0 with `Connection: keep-alive`) and it was read
to its end exactly; any decline after the request went out closes it, so
no connection is ever reused in the middle of a message. An idle one the
origin closed is dropped when the loop hears it (`connection_lost`) and is
never written to. The bytes sent are the caller's (`head`), the same
`PlainGets` sends (fill/plain_get.py `request_head`).

The answer's head is read by fill/small_head.py. Per exchange this client
makes one future and, on a connection in steady use, no timer
(`_Connection`'s one alarm serves both the exchange's timeout and the idle
wait), and reads an answer that came in one read from that read's bytes,
without copying it into a buffer first.
"""

from __future__ import annotations

import asyncio

from aiohttp import HttpVersion
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from cachenode.fill.small_head import Head, read_head
from cachenode.http.fields import FieldLines

POOL_MAX = 64  # connections per origin, idle and busy
HEAD_MAX = 64 * 1024  # an answer's head, longer: declined
IDLE_MAX = 15.0  # seconds a connection waits idle before it is closed, as aiohttp's pool's keepalive_timeout


class SmallAnswer:
    """A final 200 read whole: read by `fill/judged.py` as an origin client's answer is."""

    __slots__ = ("status", "reason", "version", "headers", "content_length", "body", "asked", "_url", "_pairs",
                 "_lines")
    method = "GET"  # what it answers, as `fill/origin.py` `ends_at_close` reads it

    def __init__(self, *, reason: str, version: HttpVersion, pairs: list[tuple[str, str]], content_length: int,
                 body: bytes, asked: str | None) -> None:
        self.status = 200
        self.reason = reason
        self.version = version
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(pairs))
        self.content_length = content_length
        self.body = body
        self.asked = asked  # the URL asked, as the caller spelt it (None: not told)
        self._url: URL | None = None
        self._pairs = pairs  # `headers`' lines in order, as its items() gives them
        self._lines: FieldLines | None = None

    def release(self) -> None:
        """Nothing to give back: its connection went back to its pool, or was closed, once it was read."""

    @property
    def url(self) -> URL | None:
        """The URL asked (fill/upstream.py `answered_by_parent` reads it), read by yarl only when asked for."""
        if self._url is None and self.asked is not None:
            self._url = URL(self.asked, encoded=True)
        return self._url

    def field_lines(self) -> FieldLines:
        lines = self._lines
        if lines is None:
            lines = self._lines = FieldLines(self._pairs)
        return lines


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an origin, reading one answer at a time.

    Its one alarm (`_alarm`) ends whatever the connection waits for when its
    deadline (`_due`) passes: the answer of its exchange (`ask`'s timeout),
    or its next exchange (`idle`: it is then closed). The alarm is not moved
    each time the deadline is: it rings no later than the deadline, and when
    the deadline has moved past the time it rang for, it is set again for the
    new one. A connection asked again and again within its idle time thus
    keeps one timer that rings about every `IDLE_MAX` seconds, instead of
    making and cancelling two for every exchange; each deadline is kept to
    the same loop time a timer of its own would have had."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self.head: Head | None = None  # the head of the answer being read, once read
        self._small_max = 0
        self._asked: str | None = None
        self._answer: asyncio.Future[SmallAnswer | None] | None = None
        self._due: float | None = None  # loop time the exchange or the idle wait ends, None: neither
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at = 0.0  # the loop time `_alarm` rings at

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._end(None)

    def eof_received(self) -> bool:
        self.closed = True
        self._end(None)
        return False

    def ask(self, head: bytes, small_max: int, timeout: float, url: str | None) -> asyncio.Future[SmallAnswer | None]:
        """Write `head` (a GET of `url`) and return the future of its answer,
        declined (None, this connection closed) unless whole within `timeout` seconds."""
        assert self.transport is not None and self._answer is None
        self._buffer.clear()
        self.head = None
        self._small_max = small_max
        self._asked = url
        self._answer = answer = self._loop.create_future()
        self.transport.write(head)
        self._wait(timeout)  # counted from the write, as a timer of its own made after it would count
        return answer

    def idle(self, idle_max: float) -> None:
        """Wait for the next exchange, closed unless it comes within `idle_max` seconds."""
        self._wait(idle_max)

    def _wait(self, seconds: float) -> None:
        due = self._due = self._loop.time() + seconds
        if self._alarm is None or self._alarm_at > due:
            if self._alarm is not None:
                self._alarm.cancel()
            self._alarm_at = due
            self._alarm = self._loop.call_at(due, self._rang)

    def _rang(self) -> None:
        self._alarm = None
        due = self._due
        if due is None:
            return
        if due <= self._alarm_at:
            self._end(None)  # the answer is late (declined), or the connection idle too long (closed)
        else:
            self._alarm_at = due
            self._alarm = self._loop.call_at(due, self._rang)

    def data_received(self, data: bytes) -> None:
        if self._answer is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted again
            return
        buffer = self._buffer
        head = self.head
        if head is None:
            # Most answers come whole in one read: read from `data`, copied only when more must come.
            if buffer:
                buffer += data
                seen: bytes | bytearray = buffer
            else:
                seen = data
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                if len(seen) > HEAD_MAX:
                    self._end(None)
                elif seen is data:
                    buffer += data
                return
            if end > HEAD_MAX:
                self._end(None)
                return
            head = self.head = read_head(bytes(seen[:end]), self._small_max)
            if head is None:
                self._end(None)
                return
            start = end + 4
        else:
            buffer += data
            seen, start = buffer, 0
        got = len(seen) - start
        if got < head.length:
            if seen is data:
                buffer += memoryview(data)[start:]
            elif start:
                del buffer[:start]
            return
        if got > head.length:
            head.keep = False  # more than the answer: never reused
        body = bytes(seen[start:start + head.length])
        buffer.clear()
        self._end(SmallAnswer(reason=head.reason, version=head.version, pairs=head.pairs,
                              content_length=head.length, body=body, asked=self._asked))

    def _end(self, answer: SmallAnswer | None) -> None:
        """The exchange ends with `answer`; a decline closes the connection."""
        waiting, self._answer = self._answer, None
        self._due = None
        if answer is None:
            self.close()
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    def close(self) -> None:
        self.closed = True
        self._due = None
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        if self.transport is not None:
            self.transport.close()


class SmallGets:
    """Keep-alive connections to plain http:// origins, at most `pool_max` per origin."""

    def __init__(self, *, pool_max: int = POOL_MAX, connect_timeout: float = 10.0,
                 idle_max: float = IDLE_MAX) -> None:
        self._pool_max = pool_max
        self._idle_max = idle_max
        self._connect_timeout = connect_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: dict[tuple[str, int], int] = {}  # connections per origin, idle and busy
        self._closed = False  # the node stops: a connection whose exchange ends then is closed, not kept

    def opened(self, host: str, port: int) -> int:
        """Connections to (host, port) open now, idle and busy."""
        return self._open.get((host, port), 0)

    async def get(self, host: str, port: int, head: bytes, *, small_max: int, timeout: float,
                  url: str | None = None) -> SmallAnswer | None:
        """The answer to the request `head` (a body-less GET) when it is a
        final 200 of at most `small_max` bytes read whole within `timeout`;
        None: anything else, nothing kept of it (see the module's docstring)."""
        where = (host, port)
        conn = self._idle_one(where) or await self._connected(where)
        if conn is None:
            return None
        answer = conn.ask(head, small_max, timeout, url)
        got: SmallAnswer | None = None
        try:
            got = await answer
        finally:
            read = conn.head
            if got is not None and read is not None and read.keep and not conn.closed and not self._closed:
                # Closed if nobody asks within IDLE_MAX: a connection a middlebox dropped silently would
                # otherwise cost its next fill the whole read timeout before the engine asks again.
                conn.idle(self._idle_max)
                self._idle.setdefault(where, []).append(conn)
            else:
                conn.close()  # declined, cancelled, or not to be reused: never again
                self._dropped(where)
        return got

    def _idle_one(self, where: tuple[str, int]) -> _Connection | None:
        """An idle connection to `where` (its idle wait ends once it is asked), or None."""
        idle = self._idle.get(where)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self._dropped(where)  # closed by the origin while idle: dropped, never written to
        return None

    async def _connected(self, where: tuple[str, int]) -> _Connection | None:
        """A new connection to `where`, or None: the pool is full, or the connect failed."""
        opened = self._open.get(where, 0)
        if opened >= self._pool_max:
            return None
        self._open[where] = opened + 1
        try:
            _, conn = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(_Connection, where[0], where[1]),
                self._connect_timeout)
        except (OSError, asyncio.TimeoutError):
            self._dropped(where)
            return None
        except BaseException:
            self._dropped(where)
            raise
        return conn

    def _dropped(self, where: tuple[str, int]) -> None:
        """One connection to `where` fewer (none counted after `close`, whose busy ones end later)."""
        n = self._open.get(where, 0)
        if n > 1:
            self._open[where] = n - 1
        else:
            self._open.pop(where, None)

    def close(self) -> None:
        """Close every idle connection, and each busy one once its exchange ends (the node stops)."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        self._open.clear()

    def __repr__(self) -> str:
        return f"SmallGets(open={dict(self._open)!r})"
