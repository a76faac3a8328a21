"""A fill's run: the background task that reads an answer's body into the
store as `fill/lead.py`'s plan says (one stream, spliced, or parallel
ranges through `fill/parallel.py`), then stores and counts it; a fill from
the parent tier that breaks off goes on from the origin.

`fill/engine.py` leads the flight and hands this object the answer it
decided to store; everything after that, until the fill lands, is here.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Coroutine, Mapping, Protocol

import aiohttp
import structlog

from cachenode.counts import Counts
from cachenode.fill.assembly import Assemblies
from cachenode.fill.at_once import AtOnce
from cachenode.fill.buffer import Fill, Superseded
from cachenode.fill.flights import Flight, Flights, Kind, Outcome, Source, flight_fill, run_fill_in_background
from cachenode.fill.judged import Judged
from cachenode.fill.lead import Arrived, Body, How, Plan, plan_fill, stored_at_once
from cachenode.fill.origin import Answered, ends_at_close
from cachenode.fill.pace import HeldBody, held, pace_of
from cachenode.fill.parallel import (RangedFetch, Validator, close_unread, if_range_validator, parallel_validator,
                                     plain_rest)
from cachenode.fill.parent_rest import rest_from_origin
from cachenode.fill.upstream import Upstream
from cachenode.fill.verify import BodyCheck, DigestMismatch, Digests
from cachenode.http.freshness import Policy, current_age
from cachenode.http.headers import Pairs
from cachenode.http.vary import variant as variant_of
from cachenode.kernel import splice
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, NotStored
from cachenode.store.writing import ObjectWrite
from nezha.config import CacheSettings, Origin
from nezha.credentials import redact_url
from nezha.errors import FillAborted, NezhaError
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import BLOCKS_HEADER, CACHE_HEADER

log = structlog.get_logger("nezha.cachenode")

# A fill reads its origin (or peer) in pieces of up to this size, one per object however many clients wait, so
# larger than a client stream's read_size. Quick benches gave 1.12-1.32 node CPU seconds per GiB filled at 1 MiB
# against 1.32-1.52 at 256 KiB: single runs, noisy, one way (docs/benchmarks.md, "Cold fills in parallel ranges").
FILL_READ = 1024 * 1024
# What a body's source breaking off mid-body raises, read or spliced: a fill with a `rest` goes on from there.
BROKE = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class Peers(Protocol):
    """What a fill asks of the node's peer client (cachenode/front/relay.py)."""

    async def ask(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                  header_timeout: float | None = None) -> aiohttp.ClientResponse:
        """`peer`'s response to a request for a copy from its disk."""

    def guard(self, peer: Peer, response: aiohttp.ClientResponse, progress: Callable[[], int]) -> asyncio.Task:
        """Cut `response` when `peer` freezes mid-body."""


class FillRuns:
    """The fills running in the background, one task each, until they land."""

    def __init__(self, *, settings: CacheSettings, store: Store, origins: Upstream, peers: Peers,
                 counts: Counts, metrics: Metrics, flights: Flights, parts: Assemblies,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
                 replicate: Callable[[Meta, Target], None], digests: Digests | None = None) -> None:
        """`digests`: the node's (its relay notes the redirects it passes on there too)."""
        self.settings = settings
        self.store = store
        self.origins = origins
        self.peers = peers
        self.counts = counts
        self.metrics = metrics
        self.flights = flights
        self.parts = parts
        self.spawn = spawn
        self.replicate = replicate  # a fill from the origin completed: copy it to the key's replicas
        self._fills: dict[asyncio.Task, Fill] = {}  # each fill's background task
        # Fills checked against the digests their sources publish (fill/verify.py).
        self.digests = digests or Digests(mismatches=metrics.digest_mismatches,
                                          origins=[o.host for o in settings.origins if not o.wildcard])
        # Small answers that came whole with their head, stored before any client is answered.
        self.at_once = AtOnce(store=store, digests=self.digests, counts=counts, metrics=metrics, flights=flights,
                              parts=parts, replicate=replicate)

    def at_rest(self, task: asyncio.Task) -> bool:
        """`task` is a fill parked waiting for clients to ask for more of it
        (an on-demand fill, cachenode/fill/parallel.py): not work in progress."""
        fill = self._fills.get(task)
        return fill is not None and fill.parked

    def _plan(self, response: aiohttp.ClientResponse, *, source: Source, origin: Origin, authorize: bool,
              from_parent: bool, resumed: bool = False) -> tuple[Plan, Validator | None, int]:
        """How the fill reads `response`'s body (`fill/lead.py` `plan_fill`),
        the validator its ranges are checked by, and how many streams it may use;
        `resumed`: `response` is a resume's 206, and the rest is fetched around it."""
        streams = origin.fill_streams or self.settings.fill_streams
        validator = self._validator(response, origin) if not resumed else if_range_validator(response.headers)
        plan = plan_fill(Body(from_peer=source.peer is not None, from_parent=from_parent,
                              delimited_by_close=ends_at_close(response),
                              rangeable=validator is not None, client_ranged=source.ranged,
                              callers_own=authorize and source.peer is None, resumed=resumed,
                              small=response.content_length is not None
                              and response.content_length <= self.store.small_max,
                              goes_on=source.rest is not None),
                         splice_fills=self.settings.splice_fills,
                         fill_on_range=origin.fill_on_range if origin.fill_on_range is not None
                         else self.settings.fill_on_range)
        return plan, validator, streams

    def _validator(self, response: aiohttp.ClientResponse, origin: Origin) -> Validator | None:
        return parallel_validator(response.status, response.headers, response.content_length,
                                  streams=origin.fill_streams or self.settings.fill_streams,
                                  threshold=origin.parallel_fill_threshold or self.settings.parallel_fill_threshold)

    def _counter(self, *, host: str, source: Source, from_parent: bool) -> tuple[Callable[[int], None],
                                                                                  dict[str, bool]]:
        """What counts a fill's bytes as they come, by where they come from,
        and the flag that says the parent still sends them (until it breaks
        off and the origin sends the rest)."""
        from_origin = self.metrics.bytes_from_origin
        from_parent_bytes = self.metrics.bytes_from_parent
        reading = {"parent": from_parent}

        def on_bytes(n: int) -> None:
            if reading["parent"]:
                from_parent_bytes.inc(n)
            elif source.peer is None:
                from_origin.inc(n)
                self.counts.count(host, bytes_from_origin=n, metrics=False)

        return on_bytes, reading

    async def start(self, flight: Flight, response: aiohttp.ClientResponse, *, key: str, url: str,
                    host: str, headers: Pairs, expires_at: float, policy: Policy, now: float,
                    target: Target, source: Source, vary: tuple[str, ...], origin: Origin,
                    authorize: bool, answered: tuple[int, int, int] | None = None, body: bytes | None = None,
                    refused: NotStored | None = None, age: float | None = None) -> Fill:
        """Start the fill of `response`'s body in the background; the fill its clients read.
        `answered`: `response` is a resume's 206 for bytes [first, end) of an object of `length`.
        `body`: the whole body, read already (`AtOnce.store_whole` could not store it): streamed from memory;
        `refused`: why the store refused it there, its clients then get it unstored.
        `age`: its Age as the leader judged it (`Judged.age`), not worked out again."""
        length = response.content_length if answered is None else answered[2]
        status = response.status if answered is None else 200
        # The parent tier's answer (not the origin's after a fallback): one
        # stream, like a peer's copy; the parent cuts the origin's into ranges.
        from_parent = self.origins.answered_by_parent(response)
        plan, validator, streams = self._plan(response, source=source, origin=origin, authorize=authorize,
                                              from_parent=from_parent, resumed=answered is not None)
        write, discarded = await self._open_write(response, length, plan=plan, resumed=answered is not None)
        # A peer's copy carries the owner's expiry (EXPIRES_HEADER) instead of an age.
        if age is None:
            age = current_age(response.headers, now) if source.peer is None else 0.0
        # Stored per variant: under the values the fill's own request had
        # for the fields the response varies on (RFC 9111 §4.1).
        variant = variant_of(vary, source.headers) if vary else ""
        meta = Meta(key=key, url=redact_url(url, origin.credential_params), host=host, size=0, headers=headers, stored_at=now, status=status,
                    expires_at=expires_at, stale_if_error=policy.stale_if_error, age=age,
                    stale_while_revalidate=policy.stale_while_revalidate, vary=vary, variant=variant,
                    authorize=authorize, hot=source.hot and source.peer is not None)
        self.metrics.fills_in_flight.inc()
        on_bytes, reading = self._counter(host=host, source=source, from_parent=from_parent)
        ranged = None
        if plan.how is How.PARALLEL:
            assert validator is not None
            ranged = self._ranged_fetch(write, length, source, validator, on_bytes, streams=streams,
                                        on_demand=plan.on_demand, landed=flight.landed, discarded=discarded,
                                        answer=response if answered is not None else None,
                                        answered=answered[:2] if answered is not None else None)
        check = self._check(response, write, key=key, target=target, source=source, resumed=answered is not None)
        fill = flight_fill(self.flights, flight, key=key, headers=headers, length=length, write=write, age=age,
                           status=status, vary=vary, variant=variant,
                           delimited_by_close=ends_at_close(response),
                           ranges=ranged[0] if ranged is not None else None, check=check,
                           blocks=response.headers.get(BLOCKS_HEADER) if source.peer is not None else None)
        if ranged is not None:
            ranged[0].attach(fill)
        rest = rest_from_origin(self.origins, response, source, reading, read_size=FILL_READ) if from_parent \
            else source.rest
        work = self._work(flight, fill, response, meta=meta, plan=plan, ranged=ranged, on_bytes=on_bytes,
                          source=source, target=target, rest=rest, body=body, refused=refused,
                          parent=response.headers.get(CACHE_HEADER, "") if from_parent else None)
        task = self.spawn(run_fill_in_background(self.flights, flight, fill, work))
        self._fills[task] = fill
        task.add_done_callback(lambda t: self._fills.pop(t, None))
        return fill

    async def _open_write(self, response: aiohttp.ClientResponse, length: int | None, *, plan: Plan,
                          resumed: bool) -> tuple[ObjectWrite, int]:
        """The store's write the fill's body goes to, with room for `length`,
        and the bytes of `response` a parallel fill dropped unread (it asks
        for its ranges anew); `response` is released when the store refuses."""
        discarded = 0
        if plan.how is How.PARALLEL and not resumed:
            # Before any await: aiohttp reads the answer ahead while it is open.
            discarded = close_unread(response)
            self.metrics.origin_bytes_discarded.inc(discarded)
        try:
            write = await self.store.writing(reserve=length or 0).open()
        except NezhaError:
            response.release()
            raise
        return write, discarded

    def _check(self, response: aiohttp.ClientResponse, write: ObjectWrite, *, key: str, target: Target,
               source: Source, resumed: bool) -> BodyCheck | None:
        """What checks the fill's bytes against the digest its source published as they land (fill/verify.py
        `Digests.check`); None: nothing to check by. A resume's 206 is checked against the whole object's
        digest its Repr-Digest or the relay resuming names."""
        return self.digests.check(key=key, target=target, status=response.status, headers=response.headers,
                                  fd=write.temp.read_fd if write.temp.fd >= 0 else -1,
                                  part=resumed,
                                  # A resume's: of the version its 206 answered If-Range for, never of
                                  # another's 200. Else a relay's (a Hugging Face redirect it saw).
                                  handed=source.handed if resumed or source.resume is None
                                  else None)

    def whole_and_small(self, response: aiohttp.ClientResponse | Answered, *, source: Source, origin: Origin,
                        authorize: bool) -> bool:
        """Whether `AtOnce.store_whole` stores `response` (`fill/lead.py` `stored_at_once`): small, and its body
        in hand with its head (read by aiohttp, or read whole already: `read`, fill/small_gets.py's)."""
        length, read = response.content_length, not isinstance(response, aiohttp.ClientResponse)
        if length is None or length > self.store.small_max or source.peer is not None:
            return False  # the common no, before any work
        from_parent = self.origins.answered_by_parent(response)
        if not stored_at_once(Arrived(status=response.status, method=response.method, length=length,
                                      buffered=length if read else response.content.total_bytes,
                                      complete=read or response.content.is_eof(),
                                      from_parent=from_parent), small_max=self.store.small_max, how=How.STREAM):
            return False
        if self._validator(response, origin) is None:
            return True  # never in parallel ranges (`plan_fill`): the one thing the plan would tell
        plan, _, _ = self._plan(response, source=source, origin=origin, authorize=authorize, from_parent=from_parent)
        return plan.how is not How.PARALLEL

    async def fill(self, flight: Flight, response: aiohttp.ClientResponse | Answered, judged: Judged, *, key: str,
                   url: str, target: Target, source: Source, origin: Origin, whole: bytes | None = None) -> Outcome:
        """Store the answer `fill/engine.py` decided to store (`judged`: what it
        made of it): at once when it is small and came whole with its head
        (`whole_and_small`, fill/at_once.py), answered as a hit; else, and when
        the at-once path could not store it plainly, by `start`'s fill that its
        clients follow. `whole`: its body, read whole already (fill/small_gets.py's
        answer, which `whole_and_small` took)."""
        body, refused = whole, None
        if body is not None or self.whole_and_small(response, source=source, origin=origin, authorize=judged.authorize):
            if body is None:
                body = await response.read()  # type: ignore[union-attr]  # in memory already: no wait on the network
            outcome = await self.at_once.store_whole(flight, response, body, judged, key=key, url=url, target=target,
                                                     source=source, origin=origin)
            if isinstance(outcome, Outcome):
                return outcome
            refused = outcome
        fill = await self.start(flight, response, key=key, url=url, host=target.host,  # type: ignore[arg-type]
                                headers=judged.kept, expires_at=judged.expires_at, policy=judged.policy,
                                now=judged.now, target=target, source=source, vary=judged.vary, origin=origin,
                                authorize=judged.authorize, body=body, refused=refused, age=judged.age)
        return Outcome(Kind.STREAMING, fill=fill)

    async def _work(self, flight: Flight, fill: Fill, response: aiohttp.ClientResponse, *, meta: Meta,
                    plan: Plan, ranged, on_bytes: Callable[[int], None], source: Source,
                    target: Target, parent: str | None = None,
                    rest: Callable[[int, BaseException], AsyncIterator[bytes]] | None = None,
                    body: bytes | None = None, refused: NotStored | None = None) -> Meta:
        """Read the body as `plan` says into the fill, then store and count it;
        `parent`: the parent tier's X-Nezha-Cache, when it was the source;
        `body`: the whole body, read already."""
        key, url, host = meta.key, meta.url, meta.host
        started = time.monotonic()
        durations = self.metrics.fill_duration
        kind = "peer" if source.peer is not None else "origin"

        def took(outcome: str) -> None:
            durations.labels(source=kind, outcome=outcome).observe(time.monotonic() - started)

        # A copy from a peer that freezes mid-body fails within seconds, not
        # after the read timeout (the origin is not probed: it has no /healthz).
        watch = self.peers.guard(source.peer, response, lambda: fill.written) if source.peer else None
        try:
            stored = await self._read_body(flight, fill, response, meta=meta, plan=plan, ranged=ranged,
                                           on_bytes=on_bytes, rest=rest, whole=body, refused=refused)
        except NotStored:
            took("not_stored")
            raise  # streamed whole to its clients, only not stored: not a failed fill
        except NezhaError as e:
            if isinstance(e, DigestMismatch):
                self.digests.mismatched(e, origin=host, key=key, source=source.peer.id if source.peer else url)
            self.counts.count(host, failed_fills=1)
            took("failed")
            raise
        except Exception as e:
            # A bug outside the fill's own run (which turns every error into
            # a NezhaError): its clients must learn it, not wait forever.
            self.counts.count(host, failed_fills=1)
            took("failed")
            raise await self._crashed(fill, e, key=key, url=url) from e
        finally:
            if watch is not None:
                watch.cancel()
            self.metrics.fills_in_flight.dec()
        if flight.superseded and await self.store.remove_one(stored):  # the write came during the commit
            took("not_stored")
            raise Superseded(f"a write to {url} succeeded while {key} was being stored")
        took("stored")
        self.counts.stored(stored, self.store.sizes())
        await self.parts.forget(key, why="stored whole by a fill")
        named = source.peer.id if source.peer else "parent" if parent is not None else "origin"
        log.info("fill_completed", key=key, bytes=stored.size, source=named, seconds=round(time.monotonic() - started, 3),
                 **({"parent_cache": parent} if parent is not None else {}),
                 **({"verified": fill.verified_by} if fill.verified_by else {}))
        if source.peer is None:
            self.replicate(stored, target)
        return stored

    @staticmethod
    async def _crashed(fill: Fill, e: Exception, *, key: str, url: str) -> FillAborted:
        """The error a fill's clients get for a bug outside the fill's own run
        (which turns every error into a NezhaError), logged; the fill ended
        with it, its file discarded, so nobody waits on it forever."""
        error = FillAborted(f"fill of {key} from {url} crashed: {type(e).__name__}: {e}")
        log.error("fill_crashed", key=key, url=url, error=f"{type(e).__name__}: {e}")
        if fill.error is None:
            fill.error = error
            await fill.writes_done()  # no thread may still write the file it closes
            await fill.writing.discard()
            fill.advance(0)  # wakes its readers, who find the error
        return error

    async def _read_body(self, flight: Flight, fill: Fill, response: aiohttp.ClientResponse, *, meta: Meta,
                         plan: Plan, ranged, on_bytes: Callable[[int], None],
                         rest: Callable[[int, BaseException], AsyncIterator[bytes]] | None = None,
                         whole: bytes | None = None, refused: NotStored | None = None) -> Meta:
        """`rest(offset, error)`: where the body goes on when the response
        breaks off after `offset` bytes (a parent's: the origin); None: it fails.
        `whole`: the body, read already: the fill takes it from memory."""
        superseded = lambda: flight.superseded  # noqa: E731
        if whole is not None:
            async def in_memory() -> AsyncIterator[bytes]:
                yield whole

            return await fill.run(in_memory(), store=self.store, meta=meta, on_bytes=on_bytes,
                                  superseded=superseded, refused=refused)
        if plan.how is How.PARALLEL:
            fetch, fallback = ranged
            return await fill.run_ranged(fetch, fallback, store=self.store, meta=meta, on_bytes=on_bytes,
                                         superseded=superseded)
        # Held within a window of the key's replica reading it, if one does (fill/pace.py).
        pace = pace_of(fill)
        if plan.how is How.SPLICED and (taken := splice.take(response)) is not None:
            return await fill.run_spliced(HeldBody(taken, pace), store=self.store, meta=meta,
                                          read_timeout=self.settings.origin_read_timeout,
                                          on_bytes=on_bytes, superseded=superseded, rest=rest, broke=BROKE)

        async def body() -> AsyncIterator[bytes]:
            got = 0
            try:
                async for chunk in held(response.content.iter_chunked(FILL_READ), pace):
                    got += len(chunk)
                    yield chunk
                return
            except BROKE as e:
                if rest is None:
                    raise
                broke: BaseException = e
            finally:
                response.release()
            async for chunk in rest(got, broke):
                yield chunk

        return await fill.run(body(), store=self.store, meta=meta, on_bytes=on_bytes, superseded=superseded)

    def _ranged_fetch(self, write: ObjectWrite, length: int | None, source: Source, validator: Validator,
                      on_bytes: Callable[[int], None], *, streams: int, on_demand: bool,
                      landed: asyncio.Event, discarded: int, answer: aiohttp.ClientResponse | None = None,
                      answered: tuple[int, int] | None = None):
        """The parallel fetch of the object `write` stores, and its one-stream
        fallback (cachenode/fill/parallel.py); built before the fill, which is
        handed the fetch as its `Ranges`."""
        async def get(headers: Mapping[str, str]) -> aiohttp.ClientResponse:
            return await self.origins.request("GET", source.url, headers=headers, what=source.what)

        async def write_at(offset: int, data: memoryview) -> None:
            await self.store.write_at(write.temp, offset, data)

        async def pump(body: splice.SocketBody, offset: int, end: Callable[[], int],
                       moved: Callable[[int], None], started: Callable[[asyncio.Future], None]) -> int:
            return await self.store.pump_into(write.temp, body, offset, end=end, moved=moved, started=started,
                                              read_timeout=self.settings.origin_read_timeout)

        fetch = RangedFetch(get=get, headers=source.headers, validator=validator,
                            length=length or 0, streams=streams, write_at=write_at,
                            read_size=FILL_READ, on_bytes=on_bytes, on_demand=on_demand,
                            pump=pump if self.settings.splice_fills else None,
                            read_timeout=self.settings.origin_read_timeout, landed=landed, discarded=discarded,
                            answer=answer, answered=answered)
        def fallback(offset: int) -> AsyncIterator[bytes]:
            return plain_rest(get, source.headers, offset=offset, length=length or 0, validator=validator,
                              read_size=FILL_READ, what=source.what)

        return fetch, fallback
