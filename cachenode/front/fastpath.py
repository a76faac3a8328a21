"""Plain GET/HEAD hits served below aiohttp; everything else handed to aiohttp.

Most dataset traffic is the same request again and again: `GET /path`,
`Host:` a dataset host, at most one byte range, no validators, no
credentials, and the object fresh on this node's disk. For a 100 KiB object aiohttp's
per-request machinery (request object, middleware, response object,
`loop.sendfile` futures) costs several times the sendfile itself, so such a
request is answered here, inside `data_received`: the head (cached per
stored object) with one `write(2)`, the body with one `sendfile(2)`, and a
task only when the socket does not take the whole body at once.

Only what `parse_plain` accepts comes here, and it accepts little: HTTP/1.1,
GET or HEAD, a short allow-list of headers, keep-alive. Anything else (a
header not on the list, a miss, a peer or internal request, an error, TLS
in the primary) hands the connection, with every byte received so far, to
aiohttp's own protocol, which serves it and the rest of that connection. A
handed-off connection never comes back, so the fast path cannot change the
meaning of any request it does not fully understand, and a request with a
body (Content-Length, Transfer-Encoding) can never be split differently by
the two parsers.

One byte range (`Range: bytes=a-b`, `bytes=a-`, `bytes=-n`) is a plain hit
too: multipart downloads (`aws s3 cp`, s5cmd, dataset loaders) read large
objects as ranges, and with `--workers` a ranged read a follower handed over
would leave all of its work to the primary. It gets the 206 the handler
gives (`Responder.hit`): the stored head with the fields that describe the
whole body left off, Content-Range, and the range by sendfile from its
offset. If-Range follows the handler's rule (`conditionals.if_range_applies`):
when it does not apply, the answer is the whole object, as there. What the
handler answers otherwise is left to it: several ranges, a range no byte
satisfies (416), a syntax it ignores.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import IO, Callable, Protocol

import structlog

from cachenode.front.connections import BUSY_RESPONSE, Gate, HeadTimer, head_timeout_response
from cachenode.front.exact_head import encode_head
from cachenode.front.sendfile import SendCut, sendfile_rest
from cachenode.http.conditionals import if_range_applies, parse_range
from cachenode.http.headers import describes_whole_body, with_date
from cachenode.store.objects import Meta
from cachenode.store.small import check as check_sealed, is_sealed
from nezha.wire import CACHE_HEADER, FROM_CHILD_HEADER, SERVED_BY_HEADER, CacheOutcome

log = structlog.get_logger("nezha.connections")

MAX_HEAD = 8192
COPY_SIZE = 256 * 1024  # a TLS hit's body is read and written in pieces of this size
# Pipelined requests are not read while a body is still going out
# (`respond.sendfile_rest` pauses reading until it is done), nor while answers the
# client has not read fill the transport past its high-water mark
# (pause_writing), so a client that pipelines without reading holds at most a
# read's worth of requests and a high-water mark of answers here
# (tests/integration/cachenode/test_fastpath.py, test_connections.py).
# Headers a plain hit may carry; any other sends the request to aiohttp.
ALLOWED = frozenset({"host", "user-agent", "accept", "accept-encoding", "connection", "range", "if-range"})
# A child node's request (a sidecar asking its parent tier, docs/cache-node.md
# "A parent tier") carries its marker and Via: neither changes what a hit is,
# so a parent serves its children's hits here too. Via alone is the handler's
# (a request that came back through this node is a loop, answered 508).
_FROM_CHILD = FROM_CHILD_HEADER.lower()
CHILD_ALLOWED = frozenset({_FROM_CHILD, "via"})
_MSG_MORE = getattr(socket, "MSG_MORE", 0)  # Linux; elsewhere the head is simply pushed at once
# One range in the form every client sends; any other (several ranges, another
# unit, spaces, a number too long to be a file offset) is the handler's to judge.
_ONE_RANGE = re.compile(r"bytes=(?:[0-9]{1,18}-[0-9]{0,18}|-[0-9]{1,18})")
# A Range line of that form, found in a head's bytes without parsing it.
_RANGE_LINE = re.compile(rb"\r\n[Rr][Aa][Nn][Gg][Ee]:[ \t]*(bytes=(?:[0-9]{1,18}-[0-9]{0,18}|-[0-9]{1,18}))[ \t]*\r\n")
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True)
class PlainRequest:
    method: str
    target: str
    host: str
    size: int  # bytes of the request head, blank line included
    range: str | None = None  # one byte range, `bytes=a-b`, `bytes=a-` or `bytes=-n`
    if_range: str | None = None


def parse_plain(buf: bytes | bytearray) -> PlainRequest | None | bool:
    """The request at the start of `buf` if it is plain; None if more bytes are
    needed; False if it is not plain (aiohttp must parse it). Pure.

    A line ended by a bare LF is never plain: waiting for a CRLF CRLF that
    never comes held such clients for an hour, while aiohttp answers them 400
    at once (RFC 9112 §2.2 lets a server refuse bare LF)."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    head = buf[:end] if end >= 0 else buf[:MAX_HEAD]
    if head.count(b"\n") != head.count(b"\r\n"):
        return False
    if end < 0:
        return None if len(buf) < MAX_HEAD else False
    try:
        head = buf[:end].decode("ascii")
    except UnicodeDecodeError:
        return False
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] not in ("GET", "HEAD") or parts[2] != "HTTP/1.1" or not parts[1]:
        return False
    host = rng = if_range = None
    child = set()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not _TOKEN.issuperset(name):
            return False  # also folded lines, which start with a space
        lname = name.lower()
        if lname in CHILD_ALLOWED:
            if lname in child:
                return False
            child.add(lname)
        elif lname not in ALLOWED:
            return False
        value = value.strip(" \t")
        if not value.isprintable():
            return False
        if lname == "host":
            if host is not None:
                return False
            host = value
        elif lname == "connection" and value.lower() != "keep-alive":
            return False
        elif lname == "range":
            if rng is not None or not _ONE_RANGE.fullmatch(value):
                return False
            rng = value
        elif lname == "if-range":
            if if_range is not None:
                return False
            if_range = value
    if not host or (child and _FROM_CHILD not in child):
        return False
    return PlainRequest(parts[0], parts[1], host, end + 4, rng, if_range)


# Request heads already judged by parse_plain, by their exact bytes: clients
# send the same few heads again and again (one per object they read), and
# judging one costs more than the rest of a hit's Python. Bounded in count
# (cleared when full) and in size (longer heads are judged every time), so
# it (and _JUDGED_RANGED below, likewise) holds at most 4 MiB whatever clients send. A head's verdict depends on
# its bytes alone, so a stale entry cannot exist.
# A ranged read's head differs from the last one only in its range, so it is
# remembered without the range's value, in a memo of its own (_JUDGED_RANGED):
# a head of one object read in a thousand ranges is one entry, not a thousand
# that push out every other. That is exact because parse_plain's verdict does
# not depend on a range of the form _RANGE_LINE finds (any such value passes
# _ONE_RANGE); the value and the head's length are the request's own. Its own
# memo, because a head with its range cut out is a head too (`Range: ` with
# no value), whose verdict is another.
_JUDGED: dict[bytes, PlainRequest | bool] = {}
_JUDGED_RANGED: dict[bytes, PlainRequest | bool] = {}
_JUDGED_MAX = 4096
_JUDGED_HEAD_MAX = 1024  # wget, curl and the SDKs send a few hundred bytes


def plain_request(buf: bytearray) -> PlainRequest | None | bool:
    """`parse_plain(buf)`, remembered for heads seen before."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        return parse_plain(buf)
    if end + 4 > _JUDGED_HEAD_MAX:
        return parse_plain(buf)
    head = bytes(buf[:end + 4])
    ranged = _RANGE_LINE.search(head)
    if ranged is None:
        judged, memo = _JUDGED, head
    else:
        judged, memo = _JUDGED_RANGED, head[:ranged.start(1)] + head[ranged.end(1):]
    verdict = judged.get(memo)
    if verdict is None:
        verdict = parse_plain(head)
        if len(judged) >= _JUDGED_MAX:
            judged.clear()
        judged[memo] = verdict  # never None: the head is complete
    if ranged is None or verdict is False:
        return verdict
    return PlainRequest(verdict.method, verdict.target, verdict.host, end + 4,
                        ranged.group(1).decode("ascii"), verdict.if_range)


def wanted_range(req: PlainRequest, meta: Meta) -> tuple[int, int] | None | bool:
    """(offset, length) of the one range a plain request asks of `meta`; None
    for the whole object (no Range, or an If-Range that does not apply); False
    when the handler must answer (a range it would refuse or ignore). Pure.

    As `conditionals.evaluate`, which the handler's answer follows."""
    if req.range is None:
        return None
    if req.if_range is not None and not if_range_applies(req.if_range, etag=meta.etag,
                                                         last_modified=meta.last_modified):
        return None
    parsed = parse_range(req.range, meta.size)
    if parsed is None or parsed is False:
        return False  # bytes=5-3 (ignored: the whole object), or none satisfiable (416)
    return parsed


def response_head(meta: Meta, *, via: str, served_by: str | None = None) -> bytes:
    """Status line and headers of a 200 for `meta`, as the handler would send
    them (cachenode/front/respond.py), without the Age line of each reuse.
    Its Date is the stored one (RFC 9110 §6.6.1): the same on every reuse.
    A hot copy says so, and names the node whose disk serves it (`served_by`)."""
    fields = [(k, v) for k, v in with_date(meta.headers, meta.stored_at) if k.lower() != "via"]
    if meta.header("Accept-Ranges") is None:
        fields.append(("Accept-Ranges", "bytes"))
    fields += [("Via", ", ".join([v for k, v in meta.headers if k.lower() == "via"] + [via])),
               (CACHE_HEADER, CacheOutcome.HOT_HIT if meta.hot else CacheOutcome.HIT),
               ("Content-Length", str(meta.size))]
    if meta.hot and served_by is not None:
        fields.append((SERVED_BY_HEADER, served_by))
    # Without the closing blank line: Age follows on each reuse.
    return encode_head("HTTP/1.1 200 OK", fields)[:-2]


# 206 heads made from 200 heads (`partial_head`), by the 200 head: the handler
# keeps one 200 head per stored object, so this holds one entry per object
# read in ranges. Bounded like _JUDGED.
_PARTIAL_HEADS: dict[bytes, bytes] = {}
_PARTIAL_HEADS_MAX = 4096


def partial_head(head: bytes) -> bytes:
    """The head of a 206 from the head of a 200 (`response_head`, without its
    closing blank line): status 206, and without Content-Length and the fields
    that describe the whole body (`describes_whole_body`), as the handler
    leaves them off a 206. Content-Range and Content-Length are the caller's
    to add: they are each request's own."""
    made = _PARTIAL_HEADS.get(head)
    if made is None:
        lines = [b"HTTP/1.1 206 Partial Content"]
        for line in head[:-2].split(b"\r\n")[1:]:
            name = line.partition(b":")[0].decode("latin-1")
            if name.lower() != "content-length" and not describes_whole_body(name):
                lines.append(line)
        made = b"\r\n".join(lines) + b"\r\n"
        if len(_PARTIAL_HEADS) >= _PARTIAL_HEADS_MAX:
            _PARTIAL_HEADS.clear()
        _PARTIAL_HEADS[head] = made
    return made


class PlainHits(Protocol):
    """What the fast path asks of the node: its two questions, nothing else."""

    def plain_hit(self, raw_target: str, host_header: str, scheme: str = "http") -> tuple[Meta, bytes, str] | None:
        """The fresh stored object a plain GET/HEAD names, its response head and data path; None: not here."""

    def fast_hit_done(self, meta: Meta, *, method: str, path: str, sent: int, ms: float,
                      gone: bool = False, first_byte: float | None = None, status: int = 200) -> None:
        """Count and log a hit the fast path served (`first_byte`: seconds from its request to its head;
        `status`: 206 for a range)."""


def _head_of(head: bytes, meta: Meta, span: tuple[int, int] | None) -> tuple[bytes, int, int, int]:
    """A hit's whole head (the stored head, a range's fields, the Age of now),
    the offset and length of its body, and its status."""
    if span is None:
        offset, length, status = 0, meta.size, 200
    else:
        (offset, length), status = span, 206
        head = partial_head(head) + b"Content-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n" % (
            offset, offset + length - 1, meta.size, length)
    return head + b"Age: %d\r\n\r\n" % meta.age_at(time.time()), offset, length, status


class FastPath(asyncio.Protocol):
    """One client connection: plain hits here, the rest handed to aiohttp.

    Every client connection starts here, also with plain hits off
    (`serve_hits=False`, handed to aiohttp at once): this is where the node's
    connection `Gate` admits it, and where its first request head is timed.
    """

    def __init__(self, *, hits: PlainHits, aiohttp_protocol: Callable[[], asyncio.Protocol] | None,
                 gate: Gate, head_timeout: float, serve_hits: bool = True,
                 hand_over: Callable[[asyncio.Transport, bytes, bool], None] | None = None,
                 received: bytes = b"", eof: bool = False) -> None:
        """`hand_over`, in a node's follower worker (cachenode/workers/), takes
        what aiohttp would: the connection with its bytes not yet answered and
        whether the client has ended its side, to give to the primary.
        `received` and `eof`: what another worker read of this connection
        before handing it here."""
        self.hits = hits
        self._aiohttp_protocol = aiohttp_protocol
        self._hand_over = hand_over
        self._gate = gate
        self._head_timeout = head_timeout
        self._serve_hits = serve_hits
        self.transport: asyncio.Transport | None = None
        self._sock: socket.socket | None = None  # the client's socket, for send(MSG_MORE)
        self._fd = -1  # its descriptor, for os.write where that socket is not at hand
        self._buf = bytearray(received)
        self._serving: asyncio.Task | None = None
        self._eof = eof
        self._write_paused = False
        self._refused = False
        self._head_timer = HeadTimer(head_timeout, self._head_timed_out)
        self.last_active = self.waiting_since = time.monotonic()
        # Over TLS (a follower worker's terminated connections): requests are
        # https, and bodies are read and written, since sendfile would bypass TLS.
        self._scheme = "http"
        self._writable: asyncio.Future | None = None

    # -- asyncio.Protocol ----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self._gate.admit(self):
            self._refuse()
            return
        if not self._serve_hits:
            self._hand_off()
            return
        sock = transport.get_extra_info("socket")
        if transport.get_extra_info("sslcontext") is not None:
            self._scheme = "https"
        elif sock is not None:
            self._fd = sock.fileno()
            # asyncio hands out a TransportSocket, which has no send(); the
            # socket.socket inside it takes flags (MSG_MORE) that os.write
            # cannot pass. Where it is not there (uvloop's pseudo-socket, a
            # later Python), heads go by os.write: correct, one packet more.
            # Not a dup: that would cost a descriptor per connection beyond
            # the two the connection cap counts (connections.PER_CONNECTION).
            raw = getattr(sock, "_sock", None)
            if isinstance(raw, socket.socket) and raw.fileno() == self._fd:
                self._sock = raw
        self._arm()
        if self._buf or self._eof:
            self._next()  # bytes another worker read before it handed the connection here

    def connection_lost(self, exc: Exception | None) -> None:
        self._gate.leave(self)
        self._disarm()
        self.transport = None
        if self._serving is not None:
            self._serving.cancel()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused client's request is read and dropped until it goes
        self.last_active = time.monotonic()
        self._buf += data
        if self._serving is None:
            self._next()

    def eof_received(self) -> bool:
        # Requests already received are still answered; the connection closes after them.
        self._eof = True
        if self._refused:
            return False
        if self._serving is None:
            self._next()
        # Over TLS there is no half-close to keep: asyncio closes after the
        # client's close_notify whatever this says, and warns if it says so.
        return self._scheme != "https"

    def pause_writing(self) -> None:
        # Answers pile up unread: stop reading requests until the client reads.
        self._write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.transport is not None and self._serving is None:
            self.transport.resume_reading()
            self._next()

    # -- what the gate asks ----------------------------------------------------
    @property
    def waiting(self) -> bool:
        """Only waiting for a request: nothing is being answered or owed."""
        return self._serving is None and not self._write_paused and self.transport is not None and not self._eof

    def reclaim(self) -> None:
        self.close()

    # -- control -----------------------------------------------------------------
    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    @property
    def idle(self) -> bool:
        return self._serving is None and self.transport is not None

    def _refuse(self) -> None:
        """503 with Retry-After, then close: over the cap, but never left unanswered."""
        self._refused = True
        self.transport.write(BUSY_RESPONSE)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        # Closed when the client has read it and hung up, or after a grace
        # period; closing at once could reset the answer away unread.
        asyncio.get_running_loop().call_later(2.0, self.close)

    def _next(self) -> None:
        """Answer complete plain hits at the head of the buffer, in order."""
        while self._serving is None and self.transport is not None and not self._write_paused:
            if not self._buf:
                break
            req = plain_request(self._buf)
            if req is None:
                break
            hit = self.hits.plain_hit(req.target, req.host, self._scheme) if req is not False else None
            span = None if hit is None else wanted_range(req, hit[0])
            if hit is None or span is False:
                self._hand_off()
                return
            if not self._serve(req, *hit, span=span):
                return
            self.waiting_since = time.monotonic()
            self._disarm()
        if self.transport is None or self._serving is not None:
            return
        if self._eof and not self._write_paused:
            self.transport.close()
        elif self._buf:
            self._arm()  # a head has begun; it has head_timeout to complete

    # -- the head timer ----------------------------------------------------------
    def _arm(self) -> None:
        self._head_timer.arm()

    def _disarm(self) -> None:
        self._head_timer.disarm()

    def _head_timed_out(self) -> None:
        if self.transport is None or self._serving is not None or self._write_paused:
            return  # answering: the next head is timed once that is done
        if self._buf:
            self.transport.write(head_timeout_response(self._head_timeout))
        log.info("request_head_timeout", seconds=self._head_timeout, partial=len(self._buf), fast=True)
        self.transport.close()

    def _hand_off(self) -> None:
        """aiohttp takes the connection and every byte not yet answered, for good."""
        transport, self.transport = self.transport, None
        self._gate.leave(self)
        self._disarm()
        if self._hand_over is not None:
            received, self._buf = bytes(self._buf), bytearray()
            self._hand_over(transport, received, self._eof)
            return
        assert self._aiohttp_protocol is not None
        protocol = self._aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._buf:
            protocol.data_received(bytes(self._buf))
        self._buf = bytearray()
        if self._eof and not protocol.eof_received():
            transport.close()

    # -- one hit ---------------------------------------------------------------
    def _serve(self, req: PlainRequest, meta: Meta, head: bytes, path: str, *,
               span: tuple[int, int] | None = None) -> bool:
        """Send one hit, whole or the range `span` (offset, length). True if it
        is complete and the next request may follow."""
        started = time.monotonic()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._hand_off()  # evicted or replaced since the lookup: aiohttp serves it as a miss
            return False
        if is_sealed(meta) and not check_sealed(fd, meta):
            os.close(fd)
            self._hand_off()  # a small object's seal fails: the handler drops it and fetches it again
            return False
        del self._buf[:req.size]
        transport = self.transport
        head, offset, length, status = _head_of(head, meta, span)
        size = length if req.method == "GET" else 0
        sent = 0
        try:
            if self._fd >= 0 and not transport.get_write_buffer_size():
                # With a body to follow, MSG_MORE holds the head back to
                # leave in the body's first segment: one packet and one
                # wake-up of the client fewer per hit. The sendfile right
                # after (or, if it takes nothing, the rest of the body)
                # pushes it out; a HEAD's head is pushed at once.
                try:
                    if size and self._sock is not None:
                        n = self._sock.send(head, _MSG_MORE)
                    else:
                        n = os.write(self._fd, head)
                except (BlockingIOError, InterruptedError):
                    n = 0
                if n < len(head):
                    transport.write(head[n:])
                elif size:
                    try:
                        sent = os.sendfile(self._fd, fd, offset, size)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
            else:
                transport.write(head)
            first_byte = time.monotonic() - started
        except OSError:
            os.close(fd)
            transport.abort()  # the client went away; connection_lost follows
            self.hits.fast_hit_done(meta, method=req.method, path=req.target, sent=sent,
                                    ms=(time.monotonic() - started) * 1000, gone=True, status=status)
            return False
        if sent >= size:
            os.close(fd)
            self.hits.fast_hit_done(meta, method=req.method, path=req.target, sent=sent,
                                    ms=(time.monotonic() - started) * 1000, first_byte=first_byte, status=status)
            return True
        f = open(fd, "rb")
        self._serving = asyncio.get_running_loop().create_task(
            self._finish(req, meta, f, offset, sent, size, started, first_byte, status))
        # Closed however the task ends, even cancelled before its first step.
        self._serving.add_done_callback(lambda _: f.close())
        return False

    async def _copy_rest(self, transport: asyncio.Transport, fd: int, offset: int, count: int) -> int:
        """Bytes [offset, offset+count) of file `fd` written to a TLS transport
        in reads of COPY_SIZE, each after the transport has room (pause_writing):
        a slow client holds a write buffer's worth here, never the object."""
        loop = asyncio.get_running_loop()
        transport.pause_reading()  # pipelined requests wait in the socket meanwhile, as under sendfile
        sent = 0
        while sent < count:
            if self._write_paused:
                self._writable = loop.create_future()
                await self._writable
            if transport.is_closing():
                raise SendCut("client went away", sent)
            data = await loop.run_in_executor(None, os.pread, fd, min(COPY_SIZE, count - sent), offset + sent)
            if not data:
                break  # the file is shorter than it was said to be: the caller aborts
            transport.write(data)
            sent += len(data)
        return sent

    async def _finish(self, req: PlainRequest, meta: Meta, f: IO[bytes], offset: int, sent: int, size: int,
                      started: float, first_byte: float, status: int) -> None:
        """The rest of a body (`size` bytes from `offset` of the file) the socket did not take at once."""
        transport = self.transport
        try:
            if self._scheme == "https":
                sent += await self._copy_rest(transport, f.fileno(), offset + sent, size - sent)
            else:
                sent += await sendfile_rest(transport, f.fileno(), offset + sent, size - sent)
        except SendCut as e:
            sent += e.sent
            transport.abort()
        except OSError:
            transport.abort()
        except asyncio.CancelledError:
            transport.abort()
            if self.transport is not None:
                raise
            # Cancelled by connection_lost: the client went away mid-body.
        finally:
            self._serving = None
        ms = (time.monotonic() - started) * 1000
        if sent < size:
            transport.abort()  # a short body must never look complete
            self.hits.fast_hit_done(meta, method=req.method, path=req.target, sent=sent, ms=ms, gone=True,
                                    first_byte=first_byte, status=status)
            return
        self.hits.fast_hit_done(meta, method=req.method, path=req.target, sent=sent, ms=ms, first_byte=first_byte,
                                status=status)
        if not self._write_paused and self.transport is not None:
            self.transport.resume_reading()  # if answers backed up during the send, it was left paused
        self._next()
