"""Cold fills of large objects as parallel range requests.

Object stores give one connection roughly 50–150 MB/s, and a throttled
origin one stream's worth; a first download through the cache should not
wait on one slow stream. When the origin's first answer shows an object of
known size at or above the threshold, `Accept-Ranges: bytes` and a strong
validator, the fill closes that answer unread and asks for the object in
fixed slices, each fetched by one `Range` + `If-Range` request read to its end,
`streams` at a time, each written into its place in the temp file
(cachenode/fill/slices.py says which slice next). No answer is cut with
the origin's bytes in flight on it, so the origin sends the object once. Clients keep streaming in order: the fill reports the
contiguous prefix as it grows.

Anything unexpected from a range (a 200 instead of 206, another validator,
a wrong `Content-Range` or length, a short body, a failed connection) stops
every stream (`RangesAbandoned`), and the fill takes the rest from one plain
stream, whose validator must still match (cachenode/fill/buffer.py
`Fill.run_ranged`): nothing of two versions is ever committed. Dragonfly
stored corrupt files when an origin ignored Range; here such an answer is
never written.

A fill led by a resume starts with an answer in hand: the origin's 206 for
the bytes the resume asked (`answer`, over `answered`). It is read into its
place as one slice while the other streams fetch the rest of the object
around it (cachenode/fill/slices.py), so no byte of it is asked twice.

With the origin's `fill_on_range` off, a fill led by a client's Range is
on demand: it fetches the slices clients ask for and nothing else, then
parks, its slices kept in the temp file for later requests to reuse (they
join the fill as any request joins a fill in progress). A request for the
whole object wants every slice, so it completes the fill; a fill parked
with nobody asking for `PARK_IDLE` seconds is dropped (`PartialDropped`),
since a temp file holds space the store reserved for the whole object.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import re
import termios
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
import structlog

from cachenode.kernel import splice
from cachenode.fill.buffer import Fill, RangesAbandoned
from cachenode.fill.unstored import PartialDropped
from cachenode.fill.slices import Plan, Slice
from nezha.errors import FillAborted, NezhaError

log = structlog.get_logger("nezha.fill")

SLICE = 8 * 1024 * 1024  # one range request's share; small next to the objects this is for
PARK_IDLE = 600.0  # seconds an on-demand fill keeps its slices with nobody asking for more
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Validator:
    """What ties every range to the same representation: sent as If-Range and compared on each answer."""

    etag: str | None
    last_modified: str | None

    @property
    def if_range(self) -> str:
        return self.etag if self.etag is not None else self.last_modified  # type: ignore[return-value]

    def mismatch(self, headers: Mapping[str, str]) -> str | None:
        """Why a response with `headers` is not of this representation, or None."""
        if self.etag is not None and headers.get("ETag") != self.etag:
            return f"ETag {headers.get('ETag')!r}, not {self.etag!r}"
        if self.last_modified is not None and headers.get("Last-Modified") != self.last_modified:
            return f"Last-Modified {headers.get('Last-Modified')!r}, not {self.last_modified!r}"
        return None


def parallel_validator(status: int, headers: Mapping[str, str], length: int | None, *, streams: int,
                       threshold: int) -> Validator | None:
    """The validator to fetch this response's object in parallel ranges with,
    or None when it must be one stream. Pure."""
    if streams < 2 or status != 200 or length is None or length < threshold:
        return None
    if "bytes" not in [v.strip().lower() for v in headers.get("Accept-Ranges", "").split(",")]:
        return None
    if "Content-Range" in headers:
        return None
    return if_range_validator(headers)


def if_range_validator(headers: Mapping[str, str]) -> Validator | None:
    """The validators of a response that a later Range request may send as
    If-Range: its ETag unless weak, and its Last-Modified; None when it has
    neither. Pure."""
    etag = headers.get("ETag")
    if etag is not None and etag.startswith("W/"):
        etag = None  # a weak validator may not be used with If-Range (RFC 9110 §13.1.5)
    last_modified = headers.get("Last-Modified")
    if etag is None and last_modified is None:
        return None
    return Validator(etag=etag, last_modified=last_modified)


def partial_mismatch(status: int, headers: Mapping[str, str], *, first: int, last: int, total: int,
                     validator: Validator) -> str | None:
    """Why an answer to `Range: bytes=first-last` cannot be written as those bytes, or None. Pure."""
    if status != 206:
        return f"answered {status} to a Range request"
    match = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
    if match is None:
        return f"Content-Range {headers.get('Content-Range')!r} is not a byte range"
    got = tuple(int(g) for g in match.groups())
    if got != (first, last, total):
        return f"Content-Range bytes {got[0]}-{got[1]}/{got[2]}, asked for {first}-{last}/{total}"
    length = headers.get("Content-Length")
    if length is not None and length.strip() != str(last - first + 1):
        return f"Content-Length {length} for a range of {last - first + 1} bytes"
    return validator.mismatch(headers)


class RangedFetch:
    """The parallel fetch of one fill's slices: `await fetch(fill)`, for `Fill.run_ranged`."""

    def __init__(self, *, get: Callable[[Mapping[str, str]], Awaitable[aiohttp.ClientResponse]],
                 headers: Mapping[str, str], validator: Validator, length: int, streams: int,
                 write_at: Callable[[int, memoryview], Awaitable[None]], read_size: int,
                 on_bytes: Callable[[int], None] | None = None, slice_size: int = SLICE,
                 on_demand: bool = False, park_idle: float | None = None,
                 pump: Callable[["splice.SocketBody", int, Callable[[], int], Callable[[int], None]],
                                Awaitable[int]] | None = None,
                 read_timeout: float = 30.0, landed: asyncio.Event | None = None, discarded: int = 0,
                 answer: aiohttp.ClientResponse | None = None, answered: tuple[int, int] | None = None) -> None:
        """`answer`: a 206 already in hand for bytes [first, end) = `answered`,
        checked by the caller; it is read as one slice, never asked again."""
        self.get = get
        self.headers = headers
        self.validator = validator
        self.length = length
        self.streams = streams
        self.write_at = write_at
        self.read_size = read_size
        self.on_bytes = on_bytes
        self.pump = pump  # (body, offset, end, moved, started): bodies over plain TCP go socket -> pipe -> file
        self.read_timeout = read_timeout
        self.flight_landed = landed  # once set, no request can reach a parked fill to ask for more
        self.on_demand = on_demand
        self.park_idle = PARK_IDLE if park_idle is None else park_idle
        self.plan = Plan(length, slice_size, on_demand=on_demand, answered=answered)
        self._answer = answer
        self.requests = 1  # the first answer's (closed unread by `close_unread`)
        self.discarded = discarded  # bytes of the first answer thrown away (`close_unread`)
        self._tasks: set[asyncio.Task] = set()
        self._fill: Fill | None = None
        self._extra: asyncio.Task | None = None
        self._wake = asyncio.Event()  # an on-demand fill's clients want more
        self._over = False  # the fetch has ended: nothing more lands
        self._started = False

    def attach(self, fill: Fill) -> None:
        """The fill this fetch writes (built with this fetch as its `Ranges`),
        known from before the fetch starts: its readers may ask for a range
        first, the leading client's Range among them."""
        self._fill = fill

    def covered_until(self, offset: int) -> int:
        return self.plan.covered_until(offset)

    async def __call__(self, fill: Fill) -> None:
        self.attach(fill)
        self._started = True
        try:
            if self._answer is not None:
                self._tasks.add(asyncio.create_task(self._answered(fill)))
            if not self.on_demand:
                self._tasks |= {asyncio.create_task(self._stream(fill)) for _ in range(self.streams)}
            else:
                self._spawn_wanted()
            while True:
                while pending := {t for t in self._tasks if not t.done()}:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                    failed = next((t for t in done if t.exception() is not None), None)
                    if failed is not None:
                        error = failed.exception()
                        if isinstance(error, RangesAbandoned):
                            raise error
                        raise RangesAbandoned(f"{type(error).__name__}: {error}") from error
                if not self.on_demand or self.plan.complete:
                    break
                await self._park(fill)
        finally:
            self._over = True  # a pump thread's late report must not move the prefix under a fallback
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self.close()
            await fill.writes_done()  # and its bytes are all down before a fallback writes the same places
        if not self.plan.complete:
            raise RangesAbandoned(f"streams stopped at byte {self.plan.prefix} of {self.length}")
        log.info("parallel_fill", key=fill.key, bytes=self.length, streams=self.streams, requests=self.requests,
                 slices=len(self.plan.slices), discarded=self.discarded)

    def close(self) -> None:
        """Close the answer in hand if no stream took it (the fill ended before it started)."""
        if self._answer is not None:
            self._answer.close()
            self._answer = None

    async def _answered(self, fill: Fill) -> None:
        """The answer in hand read into its slice; then, unless on demand, a stream like the others."""
        s, response = self.plan.answered_slice, self._answer
        assert s is not None and response is not None
        self._answer = None
        try:
            await self._copy(response, s, fill)
        finally:
            response.close()
        if not self.on_demand:
            await self._stream(fill)

    async def _park(self, fill: Fill) -> None:
        """Every slice asked for is on disk: wait for a client to ask for more
        (`want` starts its streams and wakes this)."""
        self._wake.clear()
        if self._spawn_wanted():
            return
        fill.parked = True
        log.info("partial_fill_parked", key=fill.key, bytes=self.length, on_disk=self.plan.on_disk(),
                 requests=self.requests)
        waits = [asyncio.ensure_future(self._wake.wait())]
        if self.flight_landed is not None:
            waits.append(asyncio.ensure_future(self.flight_landed.wait()))
        try:
            async with asyncio.timeout(self.park_idle):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not self._wake.is_set():
                raise PartialDropped(f"kept {self.plan.on_disk()} of {self.length} bytes of {fill.key}, fetched for "
                                     f"ranges clients asked for; its flight ended (a write to the URL superseded it), "
                                     f"so no request can ask for more")
        except TimeoutError:
            raise PartialDropped(
                f"kept {self.plan.on_disk()} of {self.length} bytes of {fill.key}, fetched for ranges "
                f"clients asked for (fill_on_range off), and nobody asked for more in {self.park_idle:g}s"
            ) from None
        finally:
            fill.parked = False
            for w in waits:
                w.cancel()

    def _spawn_wanted(self) -> bool:
        """On demand: streams for the slices clients wait for, up to `streams`
        at once. Whether any stream is running."""
        running = {t for t in self._tasks if not t.done()}
        while len(running) < self.streams and self.plan.has_unclaimed_wanted():
            task = asyncio.create_task(self._stream(self._fill))
            running.add(task)
            self._tasks.add(task)
        return bool(running)

    def want(self, first: int, end: int) -> None:
        """A client waits for bytes [first, end) beyond the prefix: their slices
        go first, on a stream of their own if no stream is free, so it is
        answered without waiting for the front of the object. On demand they
        are the only slices fetched."""
        self.plan.want(first, end)
        if self.on_demand:
            if self._started:
                self._spawn_wanted()
            self._wake.set()
            return
        if any(not t.done() for t in self._tasks) and (self._extra is None or self._extra.done()):
            # One stream beyond `streams`, at most, and only while clients wait in the middle.
            self._extra = asyncio.create_task(self._stream(self._fill, wanted_only=True))
            self._tasks.add(self._extra)

    async def _stream(self, fill: Fill, *, wanted_only: bool = False) -> None:
        while True:
            s = self.plan.next_wanted() if wanted_only else self.plan.next()
            if s is None:
                return
            first, last = s.pos, s.end - 1
            headers = {**self.headers, "Range": f"bytes={first}-{last}", "If-Range": self.validator.if_range}
            self.requests += 1
            try:
                response = await self.get(headers)
            except NezhaError as e:
                raise RangesAbandoned(f"range {first}-{last}: {e}") from e
            try:
                why = partial_mismatch(response.status, response.headers, first=first, last=last,
                                       total=self.length, validator=self.validator)
                if why is not None:
                    raise RangesAbandoned(f"range {first}-{last}: {why}")
                await self._copy(response, s, fill)
            finally:
                response.close()

    async def _copy(self, response: aiohttp.ClientResponse, s: Slice, fill: Fill) -> None:
        """The bytes of `s` from `response` into their place, until `s` ends."""
        started = s.pos
        try:
            body = splice.take(response) if self.pump is not None else None
            if body is not None:
                await self._splice(body, s, fill)
            else:
                async for data in response.content.iter_chunked(self.read_size):
                    await self._put(s, fill, data)
                    if s.done:
                        return
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise RangesAbandoned(f"range from {started}: {type(e).__name__}: {e}") from e
        if not s.done:
            raise RangesAbandoned(f"range from {started} ended at {s.pos}, before {s.end}")

    async def _put(self, s: Slice, fill: Fill, data: bytes) -> None:
        n = min(len(data), s.remaining)
        if n:
            await fill.write(self.write_at(s.pos, memoryview(data)[:n]))
            self._landed(s, fill, n)

    def _landed(self, s: Slice, fill: Fill, n: int) -> None:
        self.plan.advance(s, n)
        if self.on_bytes is not None:
            self.on_bytes(n)
        fill.advance(self.plan.prefix)

    async def _splice(self, body: "splice.SocketBody", s: Slice, fill: Fill) -> None:
        """`_copy` with the kernel moving the bytes (cachenode/kernel/splice.py), on
        a thread of the stream's own."""
        try:
            if body.buffered:
                await self._put(s, fill, body.buffered)
            if not s.done and body.remaining:
                def moved(n: int) -> None:
                    n = min(n, s.remaining)
                    if n and not self._over:
                        self._landed(s, fill, n)

                assert self.pump is not None
                await self.pump(body, s.pos, lambda: s.end, moved, fill.track)
        finally:
            body.close()


def close_unread(response: aiohttp.ClientResponse) -> int:
    """Close the first answer of a parallel fill, none of whose body was
    read, as soon as the fill is known to be parallel; return the bytes of
    it that reached this host (what aiohttp took off the socket, and what
    waits in the socket's receive queue): egress the origin was paid for
    nothing.

    Read for a slice and then closed, that answer cost every byte the
    origin had in flight on its connection (3-4% of a 128 MiB object on
    loopback); left open while the fill is set up, aiohttp reads up to
    2 MiB of it ahead. Slice 0 is a range like the rest."""
    unread = response.content.total_bytes
    conn = response.connection
    sock = conn.transport.get_extra_info("socket") if conn is not None and conn.transport is not None else None
    if sock is not None:
        queued = array.array("i", [0])
        try:
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, queued)
            unread += queued[0]
        except OSError:
            pass
    response.close()
    return unread


async def plain_rest(get: Callable[[Mapping[str, str]], Awaitable[aiohttp.ClientResponse]], headers: Mapping[str, str],
                     *, offset: int, length: int, validator: Validator, read_size: int,
                     what: str) -> AsyncIterator[bytes]:
    """The object's bytes from `offset` on, from one plain GET of the whole object
    that must still be the representation the fill began with."""
    response = await get(headers)
    try:
        why = None
        if response.status != 200:
            why = f"answered {response.status}"
        elif response.content_length != length:
            why = f"Content-Length {response.content_length}, not {length}"
        else:
            why = validator.mismatch(response.headers)
        if why is not None:
            raise FillAborted(f"{what} changed during a parallel fill ({why}): nothing of it is stored")
        async for data in skip_first(response.content.iter_chunked(read_size), offset):
            yield data
    finally:
        response.release()


async def skip_first(reads: AsyncIterator[bytes], skip: int) -> AsyncIterator[bytes]:
    """`reads` without their first `skip` bytes: the rest of an object from
    an answer that starts at byte 0 (an origin that ignored Range)."""
    async for data in reads:
        if skip:
            if len(data) <= skip:
                skip -= len(data)
                continue
            data, skip = data[skip:], 0
        yield data
