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
"""

from __future__ import annotations

import asyncio
import re

from aiohttp import HttpVersion, hdrs
from multidict import CIMultiDict, CIMultiDictProxy, istr

from cachenode.http.fields import FieldLines

POOL_MAX = 64  # connections per origin, idle and busy
HEAD_MAX = 64 * 1024  # an answer's head, longer: declined
# A line of the head, longer: declined, as aiohttp's parser refuses it (its
# max_line_size and max_field_size), so no answer the engine would fail is stored here.
LINE_MAX = 8190
IDLE_MAX = 15.0  # seconds a connection waits idle before it is closed, as aiohttp's pool's keepalive_timeout

_STATUS = re.compile(rb"HTTP/1\.([01]) (\d\d\d)(?: ([\t\x20-\x7e]*))?")
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*((?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*"
                    rb"[\x21-\x7e\x80-\xff])?)?)[ \t]*")
_VERSIONS = {b"0": HttpVersion(1, 0), b"1": HttpVersion(1, 1)}
# aiohttp's parser names a field it knows as `hdrs` spells it ("Etag" for "ETag"), which is what is stored.
_KNOWN = {str(name).lower().encode("ascii"): name for name in vars(hdrs).values() if isinstance(name, istr)}


class SmallAnswer:
    """A final 200 read whole: read by `fill/judged.py` as an origin client's answer is."""

    __slots__ = ("status", "reason", "version", "headers", "content_length", "body", "url", "_lines")
    method = "GET"  # what it answers, as `fill/origin.py` `ends_at_close` reads it

    def __init__(self, *, reason: str, version: HttpVersion, pairs: list[tuple[str, str]], content_length: int,
                 body: bytes) -> None:
        self.status = 200
        self.reason = reason
        self.version = version
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(pairs))
        self.content_length = content_length
        self.body = body
        self.url: object = None  # the URL asked, the caller's (fill/upstream.py `answered_by_parent` reads it)
        self._lines: FieldLines | None = None

    def release(self) -> None:
        """Nothing to give back: its connection went back to its pool, or was closed, once it was read."""

    def field_lines(self) -> FieldLines:
        lines = self._lines
        if lines is None:
            lines = self._lines = FieldLines(self.headers.items())
        return lines


class _Head:
    """An answer's head as far as this client reads it; `length` None: declined."""

    __slots__ = ("reason", "version", "pairs", "length", "keep")

    def __init__(self, reason: str, version: HttpVersion, pairs: list[tuple[str, str]], length: int | None,
                 keep: bool) -> None:
        self.reason, self.version, self.pairs, self.length, self.keep = reason, version, pairs, length, keep


def read_head(head: bytes, small_max: int) -> _Head | None:
    """The head of a final 200 this client answers (without its blank line),
    with its Content-Length and whether its connection may be reused; None:
    any other answer, or a head not read plainly (obsolete line folding, a
    control character, a field line without a name)."""
    lines = head.split(b"\r\n")
    if max(map(len, lines)) > LINE_MAX:
        return None
    status = _STATUS.fullmatch(lines[0])
    if status is None or status.group(2) != b"200":
        return None
    pairs: list[tuple[str, str]] = []
    lengths: list[bytes] = []
    connection: list[bytes] = []
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            return None
        name, value = field.group(1), field.group(2)
        lname = name.lower()
        if lname == b"content-length":
            lengths.append(value)
        elif lname == b"transfer-encoding":
            return None
        elif lname == b"connection":
            connection.extend(t.strip(b" \t").lower() for t in value.split(b","))
        # A value's bytes past ASCII (obs-text) as aiohttp's parser decodes them.
        pairs.append((_KNOWN.get(lname) or name.decode("ascii"), value.decode("utf-8", "surrogateescape")))
    if len(lengths) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18 or int(lengths[0]) > small_max:
        return None
    version = _VERSIONS[status.group(1)]
    # RFC 9112 §9.3: "close" ends it whatever the version; HTTP/1.0 persists only when asked to.
    keep = b"close" not in connection and (version == HttpVersion(1, 1) or b"keep-alive" in connection)
    reason = (status.group(3) or b"").decode("ascii")
    return _Head(reason, version, pairs, int(lengths[0]), keep)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an origin, reading one answer at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._head: _Head | None = None
        self._small_max = 0
        self._answer: asyncio.Future[SmallAnswer | None] | None = None
        self.expiry: asyncio.TimerHandle | None = None  # while idle: its close after IDLE_MAX

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._end(None)

    def eof_received(self) -> bool:
        self.closed = True
        self._end(None)
        return False

    def ask(self, head: bytes, small_max: int) -> asyncio.Future[SmallAnswer | None]:
        """Write `head` and return the future of its answer (None: declined, this connection closed)."""
        assert self.transport is not None and self._answer is None
        self._buffer.clear()
        self._head = None
        self._small_max = small_max
        self._answer = asyncio.get_running_loop().create_future()
        self.transport.write(head)
        return self._answer

    def data_received(self, data: bytes) -> None:
        if self._answer is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted again
            return
        buffer = self._buffer
        buffer += data
        head = self._head
        if head is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > HEAD_MAX:
                    self._end(None)
                return
            if end > HEAD_MAX:
                self._end(None)
                return
            head = self._head = read_head(bytes(buffer[:end]), self._small_max)
            if head is None:
                self._end(None)
                return
            del buffer[:end + 4]
        assert head.length is not None
        if len(buffer) < head.length:
            return
        if len(buffer) > head.length:
            head.keep = False  # more than the answer: never reused
        body = bytes(buffer[:head.length])
        buffer.clear()
        self._end(SmallAnswer(reason=head.reason, version=head.version, pairs=head.pairs,
                              content_length=head.length, body=body))

    def _end(self, answer: SmallAnswer | None) -> None:
        """The exchange ends with `answer`; a decline closes the connection."""
        waiting, self._answer = self._answer, None
        if answer is None:
            self.close()
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    def timed_out(self) -> None:
        self._end(None)

    def close(self) -> None:
        self.closed = True
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
                  url: object = None) -> SmallAnswer | None:
        """The answer to the request `head` (a body-less GET) when it is a
        final 200 of at most `small_max` bytes read whole within `timeout`;
        None: anything else, nothing kept of it (see the module's docstring)."""
        where = (host, port)
        conn = await self._connection(where)
        if conn is None:
            return None
        answer = conn.ask(head, small_max)
        timer = asyncio.get_running_loop().call_later(timeout, conn.timed_out)
        got: SmallAnswer | None = None
        try:
            got = await answer
        finally:
            timer.cancel()
            if got is not None:
                got.url = url
            read = conn._head
            if got is not None and read is not None and read.keep and not conn.closed and not self._closed:
                # Closed if nobody asks within IDLE_MAX: a connection a middlebox dropped silently would
                # otherwise cost its next fill the whole read timeout before the engine asks again.
                conn.expiry = asyncio.get_running_loop().call_later(self._idle_max, conn.close)
                self._idle.setdefault(where, []).append(conn)
            else:
                conn.close()  # declined, cancelled, or not to be reused: never again
                self._dropped(where)
        return got

    async def _connection(self, where: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(where)
        while idle:
            conn = idle.pop()
            if conn.expiry is not None:
                conn.expiry.cancel()
                conn.expiry = None
            if not conn.closed:
                return conn
            self._dropped(where)  # closed by the origin while idle: dropped, never written to
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
                if conn.expiry is not None:
                    conn.expiry.cancel()
                conn.close()
        self._idle.clear()
        self._open.clear()

    def __repr__(self) -> str:
        return f"SmallGets(open={dict(self._open)!r})"
