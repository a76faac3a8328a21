"""Plain GET/HEAD hits served below aiohttp; everything else handed to aiohttp.

Most dataset traffic is the same request again and again: `GET /path`,
`Host:` a dataset host, at most one byte range, no validators, no
credentials, and the object fresh on this node's disk. For a 100 KiB object aiohttp's
per-request machinery (request object, middleware, response object,
`loop.sendfile` futures) costs several times the sendfile itself, so such a
request is answered here, inside `data_received`: the head (cached per
stored object) with one `write(2)`, the body with one `sendfile(2)`, and a
task only when the socket does not take the whole body at once.

Only what `parse_plain` (front/plain.py) accepts comes here, and it accepts little: HTTP/1.1,
GET or HEAD, a short allow-list of headers, keep-alive. Anything else (a header not on the
list, a miss, a peer or internal request, an error, TLS in the primary) hands the connection,
with every byte received so far, to aiohttp's own protocol, which serves it. So the fast
path cannot change the meaning of any request it does not fully understand.

No byte is ever read by both parsers, so a request with a body
(Content-Length, Transfer-Encoding) can never be split differently by
them: a connection comes back from aiohttp only when what it handed was
one whole plain request head and nothing more (which has no body), aiohttp
received nothing after it, and answered it whole with keep-alive
(front/client_conn.py `ClientConnection.back`); aiohttp's parser then holds
nothing. A miss whose fill streams, say, goes to the handler and its
connection comes back for the next request. A hand-off of anything else
(bytes the fast path could not judge, pipelined requests behind it, the
client's end) is for good. With workers, a connection a follower handed the primary goes
back to it once it reads hits again (front/giving_back.py).

One byte range (`Range: bytes=a-b`, `bytes=a-`, `bytes=-n`) is a plain hit too: multipart
downloads (`aws s3 cp`, s5cmd, dataset loaders) read large objects as ranges, and with
`--workers` a ranged read a follower handed over would leave all of its work to the primary.
It gets the 206 the handler gives (`Responder.hit`): the stored head with the fields that
describe the whole body left off, Content-Range, and the range by sendfile from its offset.
If-Range follows the handler's rule (`conditionals.if_range_applies`): when it does not
apply, the answer is the whole object, as there. What the handler answers otherwise is left
to it: several ranges, a range no byte satisfies (416), a syntax it ignores.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import IO, Callable, Protocol

import structlog

from cachenode.front.connections import BUSY_RESPONSE, Gate, HeadTimer, head_timeout_response
from cachenode.front.fast_misses import FastMisses, Led
from cachenode.front.giving_back import GivesBack
from cachenode.front.hits import Named
from cachenode.front.leading import LeadsMisses
from cachenode.front.plain import PlainRequest, one_plain_request, partial_head, plain_request, wanted_range
from cachenode.kernel.sendfile import SendCut, sendfile_rest
from cachenode.store.objects import Meta
from cachenode.store.small import check as check_sealed, is_sealed

log = structlog.get_logger("nezha.connections")

COPY_SIZE = 256 * 1024  # a TLS hit's body is read and written in pieces of this size
# Pipelined requests are not read while a body is still going out
# (`respond.sendfile_rest` pauses reading until it is done), nor while answers the
# client has not read fill the transport past its high-water mark
# (pause_writing), so a client that pipelines without reading holds at most a
# read's worth of requests and a high-water mark of answers here
# (tests/integration/cachenode/test_fastpath.py, test_connections.py).
_MSG_MORE = getattr(socket, "MSG_MORE", 0)  # Linux; elsewhere the head is simply pushed at once


class HitFinder(Protocol):
    """The fast path's first question, over a store's index (cachenode/front/hits.py `PlainHitFinder`)."""

    def named(self, raw_target: str, host_header: str, scheme: str = "http") -> Named | None:
        """A plain GET/HEAD's target, origin and key; None: never a plain hit, nor a miss led here."""

    def plain_hit(self, named: Named) -> tuple[Meta, bytes, str] | None:
        """The fresh stored object a request `named` named, its response head and data path; None: not here."""


class ServedHits(Protocol):
    """The fast path's second question: the node's handler, or a follower
    worker's queue of hits for the primary to count (cachenode/workers/follower.py)."""

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


class FastPath(LeadsMisses, GivesBack, asyncio.Protocol):
    """One client connection: plain hits here, the rest handed to aiohttp.

    Every client connection starts here, also with plain hits off
    (`serve_hits=False`, handed to aiohttp at once): this is where the node's
    connection `Gate` admits it, and where its first request head is timed.
    """

    def __init__(self, *, finder: HitFinder, served: ServedHits, aiohttp_protocol: Callable[[], asyncio.Protocol] | None,
                 gate: Gate, head_timeout: float, serve_hits: bool = True,
                 hand_over: Callable[[asyncio.Transport, bytes, bool], None] | None = None,
                 received: bytes = b"", eof: bool = False, misses: FastMisses | None = None,
                 give_back: Callable[[asyncio.Transport], bool] | None = None) -> None:
        """`hand_over`, in a node's follower worker (cachenode/workers/), takes
        what aiohttp would: the connection with its bytes not yet answered and
        whether the client has ended its side, to give to the primary; `give_back`
        (the primary's) returns it to that follower (front/giving_back.py).
        `received` and `eof`: what another worker read of this connection
        before handing it here. `misses`: the plain cold misses led here
        (front/fast_misses.py); None hands every miss to aiohttp."""
        self.finder = finder
        self.served = served
        self._aiohttp_protocol = aiohttp_protocol
        self._hand_over, self._give_back = hand_over, give_back
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
        self._misses = misses
        self._leading = False  # `_serving` leads a miss's flight

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
            # asyncio hands out a TransportSocket, which has no send(); the socket.socket
            # inside it takes flags (MSG_MORE) that os.write cannot pass. Where it is not
            # there (uvloop's pseudo-socket, a later Python), heads go by os.write: correct,
            # one packet more. Not a dup: that would cost a descriptor per connection
            # beyond the two the connection cap counts (connections.PER_CONNECTION).
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
        if self._serving is not None and not self._leading:
            self._serving.cancel()  # a flight led here goes on: it is every joiner's (fast_misses.py)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused client's request is read and dropped until it goes
        self.last_active = time.monotonic()
        self._buf += data
        if self._serving is None:
            self._next()
        else:
            self.backlog_full()

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
            named = self.finder.named(req.target, req.host, self._scheme) if req is not False else None
            hit = None if named is None else self.finder.plain_hit(named)
            span = None if hit is None else wanted_range(req, hit[0])
            if hit is None and named is not None and self._misses is not None:
                miss = self._misses.take(req, self._buf[:req.size], self._scheme, named)
                if miss is not None:
                    self._lead(req, miss)
                    return
            if hit is None or span is False:
                self._hand_off()
                return
            if not self._serve(req, *hit, span=span):
                return
            self.waiting_since = time.monotonic()
            self._disarm()
            if self._give_back is not None and self._gave_back():  # only a connection a follower handed here
                return
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

    def _hand_off(self, led: Led | None = None) -> None:
        """aiohttp takes the connection and every byte not yet answered; `led`:
        the flight the fast path led for the first of them, which the handler
        answers (front/fast_misses.py). Handed one plain request and nothing
        more, it may give the connection back once it has answered it
        (`take_back`); any other hand-off is for good."""
        transport = self._let_go()
        if self._hand_over is not None:
            received, self._buf = bytes(self._buf), bytearray()
            self._hand_over(transport, received, self._eof)
            return
        assert self._aiohttp_protocol is not None
        protocol = self._aiohttp_protocol()
        if led is not None:
            protocol.led = led  # type: ignore[attr-defined]  # front/client_conn.py
        returnable = self._fd >= 0 and not self._eof and not self._write_paused and one_plain_request(self._buf)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._write_paused:
            # The transport will call its resume_writing, which asserts a pause it was
            # told of; untold, aiohttp would write on without waiting for the client.
            protocol.pause_writing()
        if self._buf:
            protocol.data_received(bytes(self._buf))
        self._buf = bytearray()
        if self._eof and not protocol.eof_received():
            transport.close()
        elif returnable:
            protocol.back = self  # type: ignore[attr-defined]  # front/client_conn.py `ClientConnection.back`

    def take_back(self, transport: asyncio.Transport, received: bytes, eof: bool) -> None:
        """The connection this fast path handed to aiohttp, given back at a
        clean request boundary (front/client_conn.py `ClientConnection.back`),
        with the bytes (`received`) and the end (`eof`) that came after it:
        served here again, as if it had never left."""
        self.transport = transport
        transport.set_protocol(self)
        self._gate.enter(self)  # admitted when it connected; aiohttp's handler has left the gate
        self._buf, self._eof, self._write_paused = bytearray(received), eof, False
        self.last_active = self.waiting_since = time.monotonic()
        if self._buf or self._eof:
            self._next()

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
            self.served.fast_hit_done(meta, method=req.method, path=req.target, sent=sent,
                                    ms=(time.monotonic() - started) * 1000, gone=True, status=status)
            return False
        if sent >= size:
            os.close(fd)
            self.served.fast_hit_done(meta, method=req.method, path=req.target, sent=sent,
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
            self.served.fast_hit_done(meta, method=req.method, path=req.target, sent=sent, ms=ms, gone=True,
                                    first_byte=first_byte, status=status)
            return
        self.served.fast_hit_done(meta, method=req.method, path=req.target, sent=sent, ms=ms, first_byte=first_byte,
                                status=status)
        if not self._write_paused and self.transport is not None:
            self.transport.resume_reading()  # if answers backed up during the send, it was left paused
        self._next()

