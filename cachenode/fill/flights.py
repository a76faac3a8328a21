"""One origin exchange per key, shared by every client that wants it.

A `Flight` is the single in-progress exchange for a key. The first request
that misses leads it (`fill/engine.py`); requests arriving meanwhile join
and learn the same outcome. When the origin answers with a storable 200
the outcome is a `Fill` (`fill/buffer.py`), which every waiter streams
from as it grows; the flight stays registered until the fill ends, so late
requests join it too.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, NamedTuple

import structlog

from cachenode.fill.buffer import Fill, StoreUnwritable
from cachenode.fill.lead import Resume
from cachenode.fill.origin import Interim
from cachenode.http.digests import Expected
from cachenode.http.vary import variant
from cachenode.store.objects import Meta, NotStored
from nezha.errors import NezhaError
from nezha.keys import Target
from nezha.ring import Peer

log = structlog.get_logger("nezha.fill")


class Source(NamedTuple):
    """Where a fill reads from: the origin, or (for replicas) a peer's disk.

    A named tuple, as `Outcome`: a cold small fill makes one of each, and a
    frozen dataclass of twelve fields costs three times as much to build
    (each field set through `object.__setattr__`); immutable all the same
    (`_replace` makes a changed copy)."""

    url: str
    what: str
    headers: Mapping[str, str]  # the request's fields (for the origin: the leading client's, forwarded)
    peer: Peer | None = None
    ranged: bool = False  # the leading client asked for a Range (which `headers` leave out)
    # The target to ask the node's parent tier for instead of `url` (cachenode/fill/upstream.py); None: `url`.
    route: Target | None = None
    # Hears the origin's interim (1xx) answers for the leading client
    # (fill/origin.py InterimResponse); None for a fill no client leads.
    interim: Interim | None = None
    # A hot copy (from a peer, for a node that does not own the key): stored
    # marked so (`Meta.hot`), within the store's hot share.
    hot: bool = False
    # The leading request resumes a body (fill/lead.py `Resume`): the origin is
    # asked for that range first, and the fill fetches the rest around it.
    resume: Resume | None = None
    # The whole-object digest a peer handed on with the request (a relay's
    # resume: that of the head it began with; nezha/wire.py DIGEST_HEADER),
    # which the fill checks its bytes against too.
    handed: Expected | None = None
    # Where a copy's body goes on when its source breaks off after `offset`
    # bytes: `rest(offset, error)` yields the bytes from there (a streaming
    # copy: the next owner, else the origin; cachenode/cluster/streaming_copies.py).
    # None: the fill fails with its source.
    rest: Callable[[int, BaseException], AsyncIterator[bytes]] | None = None
    # The leading request reads the object's bytes here: a client's GET; not a peer's (answered a chunked
    # object's manifest, it reads the chunks itself), a HEAD or a prefetch (cachenode/chunks/kept.py).
    read_here: bool = False


class Kind(enum.Enum):
    STREAMING = "streaming"  # a Fill is writing the object; stream from it
    REVALIDATED = "revalidated"  # 304: the stored object is fresh again
    STORED = "stored"  # stored at once (a chunked object's manifest): serve it as a hit
    PASSED = "passed"  # not storable: each waiter fetches for itself
    FAILED = "failed"  # the origin could not be used


class Outcome(NamedTuple):
    kind: Kind
    fill: Fill | None = None
    meta: Meta | None = None
    error: NezhaError | None = None
    # STORED at once from memory (AtOnce.store_whole): the stored body,
    # which its clients are sent instead of reading its file back.
    body: bytes | None = None

    def answers(self, request_headers: Mapping[str, str]) -> bool:
        """Whether the response this flight got answers a request with these
        fields too: always, unless it varies on one they set otherwise (RFC 9111 §4.1)."""
        held = self.fill if self.fill is not None else self.meta
        return held is None or not held.vary or variant(held.vary, request_headers) == held.variant


class Flight:
    """Its outcome's future and its `landed` event are made when first asked
    for: most flights of a cold epoch are a small fill that nobody joins,
    answered by their leader alone, and a future and an event made, set and
    dropped unread cost such a fill about a microsecond."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._outcome: asyncio.Future[Outcome] | None = None
        self._resolved: Outcome | None = None  # the outcome, while nobody has asked for its future
        self._landed: asyncio.Event | None = None
        self._has_landed = False
        self.superseded = False  # a write to the URL succeeded meanwhile: store nothing it got

    @property
    def outcome(self) -> asyncio.Future[Outcome]:
        """What the flight's joiners wait on: its outcome, once it has one."""
        if self._outcome is None:
            self._outcome = asyncio.get_running_loop().create_future()
            if self._resolved is not None:
                self._outcome.set_result(self._resolved)
        return self._outcome

    @property
    def landed(self) -> asyncio.Event:
        """Set once no request can join it any more (`Flights.land`)."""
        if self._landed is None:
            self._landed = asyncio.Event()
            if self._has_landed:
                self._landed.set()
        return self._landed

    def resolved(self) -> bool:
        """Whether it has its outcome (its future's `done()`), asked without making
        the future: a leader's coroutine closed where no loop runs asks it too."""
        return self._resolved is not None or (self._outcome is not None and self._outcome.done())

    def resolve(self, outcome: Outcome) -> None:
        """Its outcome, the first one given (a later one changes nothing)."""
        if self._outcome is None:
            if self._resolved is None:
                self._resolved = outcome
        elif not self._outcome.done():
            self._outcome.set_result(outcome)

    def land(self) -> None:
        self._has_landed = True
        if self._landed is not None:
            self._landed.set()


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
        flight.land()

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


def flight_fill(flights: Flights, flight: Flight, **fill: Any) -> Fill:
    """The fill `flight` streams to its clients (`fill` are `Fill`'s arguments).

    A fill the store cannot write lets no one join any more: its stream's
    start is gone from memory, so later requests fetch for themselves. Its
    flight lands the moment the store fails, not when the fill ends.
    """
    return Fill(on_unstored=lambda: flights.land(flight), **fill)


async def run_fill_in_background(flights: Flights, flight: Flight, fill: Fill, work: Awaitable[Meta]) -> None:
    """Keep the flight registered until the fill ends, so late requests join it.

    The fill's reader descriptor is closed in the same step as the landing:
    a request that joined the flight has already duplicated it, and none can
    join afterwards.
    """
    try:
        await work
    except StoreUnwritable:
        pass  # logged once, as store_write_failed, where the write failed
    except NotStored as e:
        log.info("response_not_stored", key=flight.key, reason=str(e))
    except NezhaError as e:
        log.warning("fill_failed", key=flight.key, error=str(e))
    except asyncio.CancelledError:
        raise
    finally:
        flights.land(flight)
        fill.close_reader()
