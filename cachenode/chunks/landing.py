"""A chunk fill's bytes as they land, from one source after another.

A chunk fill (chunks/fills.py `ChunkFills._fill`) copies its chunk from an
owner ahead of this node, else takes it from the origin. All its sources
write one temp file (`Landing`): a source that breaks off mid-chunk (a
node killed while it sent) leaves the bytes it sent there, the next one
is asked for the rest only, from the byte reached (a Range inside the
chunk of a peer, Range + If-Range of the origin), and the readers that
follow the fill as it grows (`Growing`: this node's clients, the owners
behind it, the nodes passing it on) read on from the same file without a
break. Before, each source began a file of its own from the chunk's first
byte: a first owner whose source died with 99% of a chunk sent fetched all
of it from the origin again (the stampede benchmark's `killed-chunks`,
docs/benchmarks.md).

What is kept is of the fill's version: a peer answers a chunk request only
with bytes of the version it names, and the origin's rest only under
If-Range on it; anything else is `ChunkChanged`, and the fill, with all
it kept, is thrown away (`end`). A source that sends more than it was
asked spoils the file (`spoiled`): the fill fails rather than go on from
bytes it cannot trust. A whole copy's block checksums, when its sender
sent them (a stored chunk's, cachenode/store/blocks.py), are checked at the
commit against the finished file, however many sources wrote it; the rest
of the fill's version gives the same bytes. Counted as one fill, as a fill
whose parent tier broke off and went on from the origin is
(fill/running.py): in flight from its first source's answer to its end,
its duration by the source that finished it, a failure only when none did.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator, Callable, Protocol

import aiohttp

from cachenode.chunks.sources import Growing
from cachenode.chunks.spec import CHUNK_LIFETIME
from cachenode.counts import Counts
from cachenode.fill.pace import FREE, Window
from cachenode.fill.parallel import Validator
from cachenode.fill.running import FILL_READ
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, NotStored, close_reader
from cachenode.store.writing import ObjectWrite
from nezha.errors import FillAborted
from nezha.ring import Peer
from nezha.wire import BLOCKS_HEADER


class Filled(Protocol):
    """What a landing needs of its fill (chunks/fills.py `ChunkFill`)."""

    validator: Validator
    writing: asyncio.Event  # set once its file starts growing
    growing: Growing | None
    keep: bool  # False: a chunk passed on, never committed nor counted as a fill


class Landing:
    """One chunk fill's temp file, `size` bytes long once whole, written by
    its sources in turn (`take`), then committed (`commit`) or passed
    through; `end` ends it either way."""

    def __init__(self, *, fill: Filled, size: int, host: str, store: Store, metrics: Metrics, counts: Counts,
                 clock: Callable[[], float] = time.time) -> None:
        self.fill = fill
        self.size = size
        self.host = host
        self.store = store
        self.metrics = metrics
        self.counts = counts
        self._clock = clock
        self._write: ObjectWrite | None = None
        self.growing: Growing | None = None
        self.expect: str | None = None  # a whole copy's block checksums (its sender's summary)
        self.spoiled = False  # a source sent more than it was asked: nothing of it is to be trusted
        self.origin = False  # the origin sent its last bytes
        self.began = 0  # the byte the last source was asked from: 0 unless it resumed a broken-off one
        self._started = time.monotonic()
        self._outcome = "failed"

    @property
    def opened(self) -> bool:
        return self._write is not None

    @property
    def written(self) -> int:
        return self._write.temp.written if self._write is not None else 0

    async def _open(self) -> ObjectWrite:
        """The fill's temp file, created when its first source answers: its readers follow it from then on."""
        if self._write is None:
            self._write = await self.store.writing(reserve=self.size).open()
            if self.fill.keep:  # counted as every fill is (fill/running.py); a chunk passed on is a relay
                self.metrics.fills_in_flight.inc()
                self._started = time.monotonic()
            self.growing = self.fill.growing = Growing(temp=self._write.temp, validator=self.fill.validator)
            self.fill.writing.set()  # whoever waits for the fill's first byte
        return self._write

    async def take(self, response: aiohttp.ClientResponse, *, source: str, peer: Peer | None = None,
                   origin: bool = False) -> None:
        """Append `response`'s body, the chunk's bytes from `written` on, until
        it is whole. FillAborted when it breaks off or runs short (what it
        sent is kept, for the next source to go on from) or sends more
        (`spoiled`). `response` is released either way."""
        try:
            temp = (await self._open()).temp
            assert self.growing is not None
            self.growing.peer = peer  # the owner it comes from now, for a chunk passed on
            self.origin, self.began = origin, temp.written
            if temp.written == 0 and not origin:
                self.expect = response.headers.get(BLOCKS_HEADER)  # only a whole copy's answer carries it
            async with contextlib.aclosing(self._body(response, held=origin and self.fill.keep)) as body:
                async for data in body:
                    if temp.written + len(data) > self.size:
                        self.spoiled = True
                        raise FillAborted(f"{source} sent more than the {self.size} bytes of the chunk")
                    await self._append(data)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            await self._keep_unread(response)
            if self.written != self.size:  # else whatever broke came after the last byte
                raise FillAborted(f"{source} broke off after {self.written} of the {self.size} bytes of the "
                                  f"chunk: {type(e).__name__}: {e}") from e
        finally:
            response.release()
        if self.written != self.size:
            raise FillAborted(f"{source} ended after {self.written} of the {self.size} bytes of the chunk")

    async def _body(self, response: aiohttp.ClientResponse, *, held: bool) -> AsyncIterator[bytes]:
        """`response`'s body, FILL_READ at a time. `held` (an origin fill): each
        read waits while the file is a window past the owners behind copying it
        (`Growing.pace`, fill/pace.py `Pace.room`: bounded, a copy that stalls
        is not waited for), its socket's receive buffer capped meanwhile
        (`Window`), so what the origin has sent a first owner that dies is
        at most that window and what flies past what its copies hold. A
        connection whose buffer was capped is closed once its body is in,
        never pooled: its buffer stays fixed (fill/pace.py `Window`), and
        every later request on it would be held to that."""
        pace = self.growing.pace if held and self.growing is not None else None
        sock = response.connection.transport.get_extra_info("socket") \
            if pace is not None and response.connection is not None and response.connection.transport else None
        window = Window(sock.fileno()) if sock is not None else None
        protocol = response.connection.protocol if window is not None and response.connection else None
        try:
            while True:
                if pace is not None:
                    at = self.written
                    if window is not None and at >= pace.fill_end:
                        window.held(at)
                        if window.capped and protocol is not None:
                            protocol.force_close()  # closed once its body is in: never pooled again
                            protocol = None  # once is enough
                    elif window is not None and pace.fill_end == FREE:
                        window.free()
                    await pace.room(at)
                data = await response.content.read(FILL_READ)
                if not data:
                    return
                yield data
        finally:
            if window is not None:
                window.free()

    async def _keep_unread(self, response: aiohttp.ClientResponse) -> None:
        """Write what aiohttp had received of the body but not handed out when
        it broke off: good bytes, in order, that the next source need not send."""
        data = unread(response.content)[:self.size - self.written]
        if data and self._write is not None:
            await self._append(data)

    async def _append(self, data: bytes) -> None:
        """`data` written at the end of the file, its readers woken, and counted as the origin's when the
        source sending now is the origin."""
        assert self._write is not None and self.growing is not None
        await self.store.write(self._write.temp, data)
        self.growing.moved.set()
        if self.origin:
            self.metrics.bytes_from_origin.inc(len(data))
            self.counts.count(self.host, bytes_from_origin=len(data), metrics=False)

    async def commit(self, ckey: str, *, url: str, length: int) -> Meta:
        """The whole chunk committed as `ckey`. `length`: the whole object's,
        so a hand-off can place the chunk without the manifest. Checked
        against a whole copy's block checksums when its sender sent them:
        CorruptCopy, nothing stored, when its bytes do not give them."""
        assert self._write is not None and self.written == self.size
        validator, now = self.fill.validator, self._clock()
        pairs = tuple((n, v) for n, v in (("ETag", validator.etag), ("Last-Modified", validator.last_modified))
                      if v is not None)
        meta = Meta(key=ckey, url=url, host=self.host, size=0, headers=pairs, stored_at=now,
                    expires_at=now + CHUNK_LIFETIME, length=length)
        try:
            stored = await self._write.commit(meta, expect=self.expect)
        except NotStored:
            self._outcome = "not_stored"  # whole, but not kept (larger than the store): no failed fill
            raise
        self._outcome = "stored"
        self.counts.stored(stored, self.store.sizes())
        return stored

    def passed(self) -> None:
        """The whole chunk went through to its readers, who hold descriptors of their own: nothing is
        stored (None, as a fill of a chunk passed on returns)."""
        self._outcome = "passed"
        return None

    async def end(self) -> None:
        """The fill ended, whole or not: a file not committed goes, its readers
        are woken (later ones no longer find it), and the fill is counted."""
        if self._write is None:
            return
        await self._write.discard()  # nothing once committed
        growing = self.growing
        if growing is not None:
            growing.ended = True
            growing.moved.set()
            if self.fill.growing is growing:
                self.fill.growing = None
            close_reader(growing.temp)  # readers hold duplicates of their own
        if self.fill.keep:
            self.metrics.fills_in_flight.dec()
            self.metrics.fill_duration.labels(source="origin" if self.origin else "peer",
                                              outcome=self._outcome).observe(time.monotonic() - self._started)
            if self._outcome == "failed":
                self.counts.count(self.host, failed_fills=1)


def unread(content: aiohttp.StreamReader) -> bytes:
    """The bytes aiohttp had received of a body and not yet handed out when
    its connection broke. Once a reader holds an exception every read raises
    it and drops them (aiohttp/streams.py `StreamReader.read`): up to its
    buffer's limit, megabytes when the fill's writes lag the socket, which
    the next source would be asked for again. So they are taken from its
    buffer, private fields (`_buffer`, `_buffer_offset`):
    tests/integration/cachenode/test_chunk_resume.py fails if a new aiohttp
    moves them."""
    buffer = getattr(content, "_buffer", None)
    if not buffer:
        return b""
    return b"".join(buffer)[getattr(content, "_buffer_offset", 0):]
