"""One origin exchange per key, shared by every client that wants it.

A `Flight` is the single in-progress exchange for a key. The first request
that misses leads it; requests arriving meanwhile join and learn the same
outcome. When the origin answers with a storable 200 the outcome is a
`Fill`: the body is written to a temp file by a task of its own (so a
leader that disconnects does not cancel it), and every waiter streams from
that file as it grows. Late waiters start from byte 0 of the file, so they
get bytes already streamed without the node holding them in memory.

A fill is `complete` once the whole body is on disk and matches the
origin's length; its streams end there. Storing it is a separate step that
may still refuse (a body without Content-Length that outgrew the capacity,
a disk error): the clients got every byte either way.

No aiohttp here: the body arrives as an async iterator of chunks.
"""

from __future__ import annotations

import asyncio
import enum
import os
from dataclasses import dataclass
from typing import IO, AsyncIterator, Awaitable, Callable, Mapping

import structlog

from cachenode.cluster import Peer
from cachenode.headers import Pairs
from cachenode.store import Meta, NotStored, Store, TempObject
from cachenode.vary import variant
from nezha.errors import FillAborted, NezhaError

log = structlog.get_logger("nezha.fill")


class Superseded(NotStored):
    """A write to the URL succeeded while its fill ran: what the fill got may
    predate the write, so it is streamed to its clients but never stored."""


class Fill:
    """Bytes of one object arriving from the origin into a temp file."""

    def __init__(self, *, key: str, headers: Pairs, length: int | None, temp: TempObject,
                 age: float = 0.0, status: int = 200, vary: tuple[str, ...] = (), variant: str = "") -> None:
        self.key = key
        self.status = status
        self.vary = vary  # the request fields the response varies on, and the fill's values of them
        self.variant = variant
        self.headers = headers  # the fields stored with the object (cachenode/headers.py)
        self.age = age  # the origin's Age: a response from a cache upstream is that old already
        self.length = length
        self.temp = temp
        self.url: str | None = None  # where the bytes come from, once `run` starts
        self.complete = False  # every byte is on disk, length verified
        self.meta: Meta | None = None  # set when committed
        self.error: NezhaError | None = None
        self._progress = asyncio.Event()

    def open_reader(self) -> IO[bytes]:
        """A file object of its own on the fill's bytes, valid whatever happens to the name.

        Raises FillAborted once the fill has ended and closed its reader (a
        joiner that woke late): the fill's error if it failed; otherwise its
        `meta` (stored) or `complete` (streamed, not stored) says what is left.
        """
        if self.temp.read_fd < 0:
            if self.error is not None and not self.complete:
                raise FillAborted(f"fill of {self.key} from {self.url} failed: {self.error}") from self.error
            raise FillAborted(f"fill of {self.key} from {self.url} ended before this reader opened")
        return os.fdopen(os.dup(self.temp.read_fd), "rb")

    def close_reader(self) -> None:
        if self.temp.read_fd >= 0:
            os.close(self.temp.read_fd)
            self.temp.read_fd = -1

    @property
    def written(self) -> int:
        return self.temp.written

    @property
    def finished(self) -> bool:
        return self.meta is not None or self.error is not None

    def _notify(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_beyond(self, offset: int) -> int:
        """Block until more than `offset` bytes are on disk, or the body is complete.

        Returns the bytes available (== `offset` only when complete); raises
        FillAborted if the fill failed before the body was complete, so a
        client mid-stream sees a broken connection, not a short body.
        """
        while True:
            if self.written > offset or self.complete:
                return self.written
            if self.error is not None:
                raise FillAborted(f"fill of {self.key} from {self.url} failed: {self.error}") from self.error
            await self._progress.wait()

    async def wait_finished(self) -> Meta:
        """The committed object, once the whole body is on disk; FillAborted otherwise."""
        while True:
            if self.error is not None:
                raise FillAborted(f"fill of {self.key} failed: {self.error}") from self.error
            if self.meta is not None:
                return self.meta
            await self._progress.wait()

    async def run(self, chunks: AsyncIterator[bytes], *, store: Store, meta: Meta,
                  on_bytes: Callable[[int], None] | None = None,
                  superseded: Callable[[], bool] = lambda: False) -> Meta:
        """Copy the origin body to disk, verify its length, commit it.

        Raises TooLarge, after every client got the whole body, when a body
        of unknown length turned out larger than the store's capacity, and
        Superseded when `superseded()` says a write made it obsolete.
        """
        self.url = meta.url
        try:
            async for chunk in chunks:
                await store.write(self.temp, chunk)
                if on_bytes:
                    on_bytes(len(chunk))
                self._notify()
            if self.length is not None and self.written != self.length:
                raise FillAborted(
                    f"origin {self.url} sent {self.written} of {self.length} bytes for {self.key}")
            self.complete = True
            self._notify()
            if superseded():
                raise Superseded(f"a write to {self.url} succeeded while {self.key} was being fetched")
            self.meta = await store.commit(self.temp, meta)
            return self.meta
        except asyncio.CancelledError:
            self.error = FillAborted(f"fill of {self.key} from {self.url} was cancelled")
            await store.discard(self.temp)
            raise
        except Exception as e:
            self.error = e if isinstance(e, NezhaError) else FillAborted(
                f"reading the body of origin {self.url} for {self.key}: {type(e).__name__}: {e}")
            await store.discard(self.temp)
            if self.error is e:
                raise
            raise self.error from e
        finally:
            self._notify()


@dataclass(frozen=True)
class Source:
    """Where a fill reads from: the origin, or (for replicas) a peer's disk."""

    url: str
    what: str
    headers: Mapping[str, str]  # the request's fields (for the origin: the leading client's, forwarded)
    peer: Peer | None = None


class Kind(enum.Enum):
    STREAMING = "streaming"  # a Fill is writing the object; stream from it
    REVALIDATED = "revalidated"  # 304: the stored object is fresh again
    PASSED = "passed"  # not storable: each waiter fetches for itself
    FAILED = "failed"  # the origin could not be used


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    fill: Fill | None = None
    meta: Meta | None = None
    error: NezhaError | None = None

    def answers(self, request_headers: Mapping[str, str]) -> bool:
        """Whether the response this flight got answers a request with these
        fields too: always, unless it varies on one they set otherwise (RFC 9111 §4.1)."""
        held = self.fill if self.fill is not None else self.meta
        return held is None or not held.vary or variant(held.vary, request_headers) == held.variant


class Flight:
    def __init__(self, key: str) -> None:
        self.key = key
        self.outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.landed = asyncio.Event()  # set once no request can join it any more
        self.superseded = False  # a write to the URL succeeded meanwhile: store nothing it got

    def resolve(self, outcome: Outcome) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)


class Flights:
    """The registry of exchanges in progress: at most one per key."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}

    def __len__(self) -> int:
        return len(self._flights)

    def get(self, key: str) -> Flight | None:
        return self._flights.get(key)

    def lead_or_join(self, key: str) -> tuple[Flight, bool]:
        flight = self._flights.get(key)
        if flight is not None:
            return flight, False
        flight = Flight(key)
        self._flights[key] = flight
        return flight, True

    def land(self, flight: Flight) -> None:
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
        flight.landed.set()

    def supersede(self, key: str) -> None:
        """A write to `key` succeeded: its exchange in progress, if any, stores
        nothing, and later requests start their own (RFC 9111 §4.4)."""
        flight = self._flights.get(key)
        if flight is not None:
            flight.superseded = True
            self.land(flight)

    def abort(self, flight: Flight, error: NezhaError) -> None:
        """The leader went away before the origin answered: joiners retry."""
        self.land(flight)
        flight.resolve(Outcome(Kind.FAILED, error=error))


async def run_fill_in_background(flights: Flights, flight: Flight, fill: Fill, work: Awaitable[Meta]) -> None:
    """Keep the flight registered until the fill ends, so late requests join it.

    The fill's reader descriptor is closed in the same step as the landing:
    a request that joined the flight has already duplicated it, and none can
    join afterwards.
    """
    try:
        await work
    except NotStored as e:
        log.info("response_not_stored", key=flight.key, reason=str(e))
    except NezhaError as e:
        log.warning("fill_failed", key=flight.key, error=str(e))
    except asyncio.CancelledError:
        raise
    finally:
        flights.land(flight)
        fill.close_reader()
