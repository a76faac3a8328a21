"""The fill engine: leads a flight (one request to the source for everyone
waiting on a key) and runs the fill its answer starts, in the background.

What to do with an answer is `fill/lead.py`'s pure decision; this module
is only the I/O around it: asking the origin or a peer, renewing a stored
object on a 304, starting the fill as one stream, a spliced one, or
parallel ranges (`fill/parallel.py`), and storing and counting the result.
Callers above it (the request handler, hand-off, invalidation) hold this
object, never the node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import AsyncIterator, Callable, Coroutine, Any, Mapping, Protocol

import aiohttp
import structlog
from multidict import CIMultiDict

from cachenode.counts import Counts
from cachenode.fill.assembly import Assemblies
from cachenode.fill.buffer import Fill, Superseded
from cachenode.fill.flights import Flight, Flights, Kind, Outcome, Source, flight_fill, run_fill_in_background
from cachenode.fill.lead import Answer, Body, How, Plan, Step, decide, plan_fill
from cachenode.fill.origin import Interim, ends_at_close, forwarded_request_headers
from cachenode.fill.upstream import Upstream
from cachenode.fill.verify import DigestMismatch, Digests
from cachenode.fill.parallel import (RangedFetch, Validator, close_unread, if_range_validator, parallel_validator,
                                     partial_mismatch, plain_rest, skip_first)
from cachenode.http.freshness import Policy, current_age, may_serve_stale_on_error, response_policy
from cachenode.http.headers import Pairs, header_bytes, renewed_by_304, stored_pairs, with_date
from cachenode.http.vary import variant as variant_of
from cachenode.http.vary import vary_names
from cachenode.kernel import splice
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, NotStored
from cachenode.store.writing import ObjectWrite
from nezha.chunks import Layout, Manifest, chunks_on
from nezha.config import CacheSettings, Origin
from nezha.credentials import redact_url
from nezha.errors import FillAborted, NezhaError, OriginError
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import AUTHORIZE_HEADER, CACHE_HEADER, CHUNKED_HEADER, EXPIRES_HEADER, CacheOutcome

log = structlog.get_logger("nezha.cachenode")


class LeaderGone(FillAborted):
    """The request leading a flight ended before the origin answered."""


# A fill reads its origin (or peer) in pieces of up to this size: one per
# object however many clients wait, so larger than a client stream's
# read_size. Quick benches gave 1.12-1.32 node CPU seconds per GiB filled
# at 1 MiB against 1.32-1.52 at 256 KiB: single runs, noisy, in the same
# direction (docs/benchmarks.md, "Cold fills in parallel ranges").
FILL_READ = 1024 * 1024
# A fill asks for the whole object whatever one client asked: its own
# validators replace the client's, and Range is applied to the stored bytes.
NOT_FOR_FILLS = frozenset({"range", "if-range", "if-match", "if-none-match", "if-modified-since",
                           "if-unmodified-since"})


class Peers(Protocol):
    """What a fill asks of the node's peer client (cachenode/front/relay.py)."""

    async def ask(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                  header_timeout: float | None = None) -> aiohttp.ClientResponse:
        """`peer`'s response to a request for a copy from its disk."""

    def guard(self, peer: Peer, response: aiohttp.ClientResponse, progress: Callable[[], int]) -> asyncio.Task:
        """Cut `response` when `peer` freezes mid-body."""


class ChunkedObjects(Protocol):
    """What the engine asks of the node's chunks (cachenode/chunks/copies.py `ChunkCopies`)."""

    def spread(self) -> bool:
        """Whether the ring has other nodes to spread a large object's chunks over."""

    async def drop_chunks(self, key: str) -> int:
        """Remove the chunks of an object stored here, of every version and
        chunk size, and let no chunk fill under way keep one; how many went."""

    def replaced(self, old: Meta, new: Meta | None) -> None:
        """A fill from the origin replaced the stored manifest `old` (`new`:
        the new manifest, or None when stored whole): the old version's chunks go."""


class FillEngine:
    def __init__(self, *, settings: CacheSettings, store: Store, origins: Upstream, peers: Peers,
                 counts: Counts, metrics: Metrics, via: str,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
                 replicate: Callable[[Meta, Target], None], chunks: ChunkedObjects,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.origins = origins
        self.peers = peers
        self.counts = counts
        self.metrics = metrics
        self.via = via
        self.spawn = spawn
        self.replicate = replicate  # a fill from the origin completed: copy it to the key's replicas
        self.flights = Flights()
        # Fills checked against the digests their sources publish (issue 37).
        self.digests = Digests(mismatches=metrics.digest_mismatches,
                               origins=[o.host for o in settings.origins if not o.wildcard])
        # Objects assembled from the parts signed ranged reads bring (authorize origins).
        self.parts = Assemblies(store=store, counts=counts, replicate=replicate, clock=clock)
        self._clock = clock
        self._fills: dict[asyncio.Task, Fill] = {}  # each fill's background task
        self.chunks = chunks  # large objects stored as chunks across the ring

    def at_rest(self, task: asyncio.Task) -> bool:
        """`task` is a fill parked waiting for clients to ask for more of it
        (an on-demand fill, cachenode/fill/parallel.py): not work in progress."""
        fill = self._fills.get(task)
        return fill is not None and fill.parked

    async def forget(self, keys: list[str], *, why: str) -> int:
        """Remove what this node stores for `keys`, and let no fill in
        progress store them; how many objects went."""
        removed = 0
        for key in keys:
            self.flights.supersede(key)
            await self.parts.forget(key, why="invalidated")
            for meta in await self.store.remove(key):  # every variant
                self.counts.gone(meta)
                log.info("object_invalidated", key=key, reason=why)
                removed += 1
            # A chunked object's chunks may be here although its manifest is
            # not (it lives on the key's owners): each node drops its own.
            removed += await self.chunks.drop_chunks(key)
        return removed

    def revalidate_soon(self, *, key: str, url: str, origin: Origin, stale: Meta, target: Target,
                        source: Source) -> None:
        """Revalidate a stale object in the background while it is served
        (stale-while-revalidate, RFC 5861 §3); nothing if a fetch of the key
        is already under way."""
        if self.flights.get(key) is not None:
            return
        # Its client is answered from disk already: no interim answer is its.
        source = dataclasses.replace(source, interim=None)

        async def revalidate() -> None:
            flight, leader = self.flights.lead_or_join(key)
            if not leader:
                return
            _, response = await self.lead(flight, key=key, url=url, origin=origin, stale=stale,
                                          target=target, source=source)
            if response is not None:
                response.release()

        self.spawn(revalidate())

    def origin_source(self, url: str, client_headers: Mapping[str, str], *,
                      drop: frozenset[str] = NOT_FOR_FILLS, route: Target | None = None,
                      interim: Interim | None = None) -> Source:
        """The origin, asked with the leading client's own fields (all but its
        validators and Range: the fill fetches the whole object for everyone;
        an `authorize` origin's caller keeps every field it may have signed);
        through the parent tier when `route` names the target to ask it for.
        `interim` forwards the origin's 1xx answers to that client."""
        headers = forwarded_request_headers(client_headers, via=self.via, drop=drop)
        return Source(url=url, what=f"origin {url}", headers=headers, ranged="Range" in client_headers, route=route,
                      interim=interim)

    async def lead(self, flight: Flight, *, key: str, url: str, origin: Origin, stale: Meta | None,
                   target: Target, source: Source) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        """Ask the source once for everybody waiting on `key`; the step taken
        with its answer is `fill/lead.py`'s decision, this is only its I/O."""
        response: aiohttp.ClientResponse | None = None
        try:
            try:
                response = await self._ask(source, stale)
            except OriginError as e:
                self.flights.land(flight)
                self.counts.count(target.host, failed_fills=1)
                return self._resolve_flight(flight, Outcome(Kind.FAILED, error=e)), None
            now = self._clock()
            self.digests.noted(target, response.status, response.headers)
            # A peer's copy of an `authorize` origin's object stays one, whatever this node's table says.
            authorize = origin.credentials == "authorize" or (
                source.peer is not None and response.headers.get(AUTHORIZE_HEADER) == "1")
            policy = response_policy(response.status, response.headers, now=now, policy_ttl=origin.default_ttl,
                                     private_ok=authorize, targeted=origin.targeted_cache_control)
            expires_at = now + policy.ttl
            kept = with_date(stored_pairs(response.headers), now)
            names = vary_names(response.headers)
            chunk_size, length = self._chunking(response, origin=origin, source=source, vary=names,
                                                authorize=authorize)
            decision = decide(_answer(response, policy=policy, vary=names, kept=kept, source=source,
                                      # Capacity is per chunk: a chunked object fits whatever its size.
                                      fits=self.store.fits if chunk_size is None else lambda _: True,
                                      authorize=authorize),
                              stale_held=stale is not None, stale_usable_on_error=stale is not None and (
                                  may_serve_stale_on_error(now=now, expires_at=stale.expires_at,
                                                           stale_if_error=stale.stale_if_error)))
            if decision.step is Step.PEER_REFUSED:
                # A peer copy is all or nothing: a replica never falls back to the origin.
                error = OriginError(f"{source.what} answered {response.status} for {key}")
                response.release()
                return self._landed(flight, Outcome(Kind.FAILED, error=error)), None
            if source.peer is not None:
                try:
                    expires_at = float(response.headers.get(EXPIRES_HEADER, expires_at))
                except ValueError:
                    pass
            age = current_age(response.headers, now) if source.peer is None else 0.0
            if decision.step is Step.REVALIDATED:
                assert stale is not None
                response.release()
                meta = await self._revalidated(stale, response, key=key, now=now, origin=origin)
                return self._landed(flight, Outcome(Kind.REVALIDATED, meta=meta)), None
            if decision.step is Step.STALE_ON_ERROR:
                response.release()
                error = OriginError(f"{source.what} returned {response.status}")
                return self._landed(flight, Outcome(Kind.FAILED, error=error)), None
            if decision.step is Step.PASS:
                log.info("response_not_stored", key=key, reason=decision.reason)
                return self._landed(flight, Outcome(Kind.PASSED)), response
            if chunk_size is not None:
                # The object is stored as chunks across the ring, each filled
                # by its owners with ranges when first read: this node keeps
                # only the manifest, and closes the first answer unread (no
                # byte of it is stored here).
                if source.peer is None:
                    self.metrics.origin_bytes_discarded.inc(close_unread(response))
                else:
                    response.release()
                response = None
                meta = await self._store_manifest(key=key, url=url, origin=origin, target=target, headers=kept,
                                                  now=now, expires_at=expires_at, policy=policy, length=length,
                                                  chunk_size=chunk_size, age=age, hot=source.hot and source.peer is not None)
                if source.peer is None:
                    self.replicate(meta, target)  # the manifest's other owners copy it (never the bytes)
                    if stale is not None and stale.chunk_size:
                        self.chunks.replaced(stale, meta)
                return self._landed(flight, Outcome(Kind.STORED, meta=meta)), None
            fill = await self._start_fill(flight, response, key=key, url=url, host=target.host, headers=kept,
                                          expires_at=expires_at, policy=policy, now=now, target=target,
                                          source=source, vary=names, origin=origin, authorize=authorize)
            response = None  # the fill owns it now
            if source.peer is None and stale is not None and stale.chunk_size:
                self.chunks.replaced(stale, None)  # its new answer is stored whole
            return self._resolve_flight(flight, Outcome(Kind.STREAMING, fill=fill)), None
        except BaseException as e:
            if response is not None:
                response.release()
            if not flight.outcome.done():
                self.flights.abort(flight, LeaderGone(f"request leading the fetch of {key} ended: {e!r}"))
            raise

    def _chunking(self, response: aiohttp.ClientResponse, *, origin: Origin, source: Source,
                  vary: tuple[str, ...] | None, authorize: bool) -> tuple[int | None, int]:
        """The chunk size to store `response`'s object in across the ring
        (nezha/chunks.py) and the object's length, or (None, 0) to store it whole.

        From the origin: a 200 at least the origin's chunk_threshold long,
        with byte ranges and a strong validator (each chunk is a Range +
        If-Range under it, as a parallel fill's slices are), not varying,
        not an `authorize` origin's (each read is the origin's to allow), not
        the parent tier's, and only on a node with others in its ring. From a peer: its answer says it is a manifest
        (CHUNKED_HEADER; a replica or a hand-off copies the manifest alone).
        """
        if source.peer is not None:
            said = response.headers.get(CHUNKED_HEADER)
            if said is None or response.status != 200:
                return None, 0
            try:
                manifest = Manifest.decode(said)
            except ValueError:
                return None, 0
            return manifest.chunk_size, manifest.length
        if authorize or vary != () or self.origins.answered_by_parent(response) or not self.chunks.spread():
            return None, 0
        threshold, chunk_size = self.settings.chunking(origin)
        length = response.content_length
        if not chunks_on(threshold, length):
            return None, 0
        # streams=2: a chunked object is fetched in ranges whatever the node's fill_streams.
        if parallel_validator(response.status, response.headers, length, streams=2, threshold=threshold) is None:
            return None, 0
        return chunk_size, length or 0

    async def _store_manifest(self, *, key: str, url: str, origin: Origin, target: Target, headers: Pairs,
                              now: float, expires_at: float, policy: Policy, length: int, chunk_size: int,
                              age: float, hot: bool) -> Meta:
        """Commit the manifest of a chunked object: its headers, length and
        chunk size, and an empty data file; its chunks are filled when read."""
        meta = Meta(key=key, url=redact_url(url, origin.credential_params), host=target.host, size=0,
                    headers=headers, stored_at=now, expires_at=expires_at, stale_if_error=policy.stale_if_error,
                    age=age, stale_while_revalidate=policy.stale_while_revalidate, chunk_size=chunk_size,
                    length=length, hot=hot)
        async with self.store.writing(readable=False) as write:  # an empty file that nobody reads
            stored = await write.commit(meta)
        self.counts.stored(stored)
        log.info("object_chunked", key=key, bytes=length, chunk_size=chunk_size,
                 chunks=Layout(size=length, chunk_size=chunk_size).count)
        return stored

    async def _ask(self, source: Source, stale: Meta | None) -> aiohttp.ClientResponse:
        """The source's answer to the fill's request, made conditional on what is stored."""
        headers = CIMultiDict(source.headers)
        if stale is not None:
            if stale.etag:
                headers["If-None-Match"] = stale.etag
            if stale.last_modified:
                headers["If-Modified-Since"] = stale.last_modified
        if source.peer is not None:
            # A copy is served from the source's disk or refused at once;
            # a source that stops answering is given up by probing it.
            return await self.peers.ask(source.peer, "GET", source.url, headers=headers,
                                        header_timeout=self.settings.origin_read_timeout)
        return await self.origins.request("GET", source.url, headers=headers, what=source.what, route=source.route,
                                          interim=source.interim)

    @staticmethod
    def _resolve_flight(flight: Flight, outcome: Outcome) -> Outcome:
        flight.resolve(outcome)
        return outcome

    def _landed(self, flight: Flight, outcome: Outcome) -> Outcome:
        """End `flight` with `outcome`: nothing of it is left to store."""
        self.flights.land(flight)
        return self._resolve_flight(flight, outcome)

    async def _revalidated(self, stale: Meta, response: aiohttp.ClientResponse, *, key: str, now: float,
                           origin: Origin) -> Meta:
        """The stored object `stale`, renewed by the 304 `response`."""
        merged, renewed = renewed_by_304(stale.status, stale.headers, response.headers.items(), now=now,
                                         policy_ttl=origin.default_ttl,
                                         private_ok=origin.credentials == "authorize",
                                         targeted=origin.targeted_cache_control)
        meta = await self.store.refresh(
            stale, headers=merged, stored_at=now, expires_at=now + renewed.ttl,
            age=current_age(response.headers, now), stale_if_error=renewed.stale_if_error,
            stale_while_revalidate=renewed.stale_while_revalidate)
        if not renewed.storable:
            # The 304 made it one client's (private, no-store, Set-Cookie):
            # this request may have it, nobody after (RFC 9111 §3.2, §3).
            log.info("object_not_kept", key=key, reason=renewed.reason)
            if await self.store.remove_one(meta):
                self.counts.gone(meta)
        return meta

    async def _start_fill(self, flight: Flight, response: aiohttp.ClientResponse, *, key: str, url: str,
                          host: str, headers: Pairs, expires_at: float, policy: Policy, now: float,
                          target: Target, source: Source, vary: tuple[str, ...], origin: Origin,
                          authorize: bool) -> Fill:
        length = response.content_length
        # The parent tier's answer (not the origin's after a fallback): one
        # stream, like a peer's copy; the parent cuts the origin's into ranges.
        from_parent = self.origins.answered_by_parent(response)
        streams = origin.fill_streams or self.settings.fill_streams
        validator = parallel_validator(
            response.status, response.headers, length, streams=streams,
            threshold=origin.parallel_fill_threshold or self.settings.parallel_fill_threshold)
        plan = plan_fill(Body(from_peer=source.peer is not None, from_parent=from_parent,
                              delimited_by_close=ends_at_close(response),
                              rangeable=validator is not None, client_ranged=source.ranged,
                              callers_own=authorize and source.peer is None),
                         splice_fills=self.settings.splice_fills,
                         fill_on_range=origin.fill_on_range if origin.fill_on_range is not None
                         else self.settings.fill_on_range)
        discarded = 0
        if plan.how is How.PARALLEL:
            # Before any await: aiohttp reads the answer ahead while it is open.
            discarded = close_unread(response)
            self.metrics.origin_bytes_discarded.inc(discarded)
        try:
            write = await self.store.writing(reserve=length or 0).open()
        except NezhaError:
            response.release()
            raise
        # A peer's copy carries the owner's expiry (EXPIRES_HEADER) instead of an age.
        age = current_age(response.headers, now) if source.peer is None else 0.0
        # Stored per variant: under the values the fill's own request had
        # for the fields the response varies on (RFC 9111 §4.1).
        variant = variant_of(vary, source.headers) if vary else ""
        meta = Meta(key=key, url=redact_url(url, origin.credential_params), host=host, size=0, headers=headers, stored_at=now, status=response.status,
                    expires_at=expires_at, stale_if_error=policy.stale_if_error, age=age,
                    stale_while_revalidate=policy.stale_while_revalidate, vary=vary, variant=variant,
                    authorize=authorize, hot=source.hot and source.peer is not None)
        self.metrics.fills_in_flight.inc()
        from_origin = self.metrics.bytes_from_origin
        from_parent_bytes = self.metrics.bytes_from_parent
        reading = {"parent": from_parent}  # until the parent breaks off and the origin sends the rest

        def on_bytes(n: int) -> None:
            if reading["parent"]:
                from_parent_bytes.inc(n)
            elif source.peer is None:
                from_origin.inc(n)
                self.counts.count(host, bytes_from_origin=n, metrics=False)

        ranged = None
        if plan.how is How.PARALLEL:
            assert validator is not None
            ranged = self._ranged_fetch(write, length, source, validator, on_bytes, streams=streams,
                                        on_demand=plan.on_demand, landed=flight.landed, discarded=discarded)
        check = self.digests.check(key=key, target=target, status=response.status, headers=response.headers,
                                   fd=write.temp.read_fd if write.temp.fd >= 0 else -1)
        fill = flight_fill(self.flights, flight, key=key, headers=headers, length=length, write=write, age=age,
                           status=response.status, vary=vary, variant=variant,
                           delimited_by_close=ends_at_close(response),
                           ranges=ranged[0] if ranged is not None else None, check=check)
        if ranged is not None:
            ranged[0].attach(fill)
        rest = self._rest_from_origin(response, source, reading) if from_parent else None
        work = self._fill_work(flight, fill, response, meta=meta, plan=plan, ranged=ranged, on_bytes=on_bytes,
                               source=source, target=target, rest=rest,
                               parent=response.headers.get(CACHE_HEADER, "") if from_parent else None)
        task = self.spawn(run_fill_in_background(self.flights, flight, fill, work))
        self._fills[task] = fill
        task.add_done_callback(lambda t: self._fills.pop(t, None))
        return fill

    async def _fill_work(self, flight: Flight, fill: Fill, response: aiohttp.ClientResponse, *, meta: Meta,
                         plan: Plan, ranged, on_bytes: Callable[[int], None], source: Source,
                         target: Target, parent: str | None = None,
                         rest: Callable[[int, BaseException], AsyncIterator[bytes]] | None = None) -> Meta:
        """Read the body as `plan` says into the fill, then store and count it;
        `parent`: the parent tier's X-Nezha-Cache, when it was the source."""
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
                                           on_bytes=on_bytes, rest=rest)
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
            error = FillAborted(f"fill of {key} from {url} crashed: {type(e).__name__}: {e}")
            log.error("fill_crashed", key=key, url=url, error=f"{type(e).__name__}: {e}")
            if fill.error is None:
                fill.error = error
                await fill.writes_done()  # no thread may still write the file it closes
                await fill.writing.discard()
                fill.advance(0)  # wakes its readers, who find the error
            raise error from e
        finally:
            if watch is not None:
                watch.cancel()
            self.metrics.fills_in_flight.dec()
        if flight.superseded and await self.store.remove_one(stored):  # the write came during the commit
            took("not_stored")
            raise Superseded(f"a write to {url} succeeded while {key} was being stored")
        took("stored")
        self.counts.stored(stored)
        await self.parts.forget(key, why="stored whole by a fill")
        named = source.peer.id if source.peer else "parent" if parent is not None else "origin"
        log.info("fill_completed", key=key, bytes=stored.size, source=named, seconds=round(time.monotonic() - started, 3),
                 **({"parent_cache": parent} if parent is not None else {}),
                 **({"verified": fill.verified_by} if fill.verified_by else {}))
        if source.peer is None:
            self.replicate(stored, target)
        return stored

    async def _read_body(self, flight: Flight, fill: Fill, response: aiohttp.ClientResponse, *, meta: Meta,
                         plan: Plan, ranged, on_bytes: Callable[[int], None],
                         rest: Callable[[int, BaseException], AsyncIterator[bytes]] | None = None) -> Meta:
        """`rest(offset, error)`: where the body goes on when the response
        breaks off after `offset` bytes (a parent's: the origin); None: it fails."""
        superseded = lambda: flight.superseded  # noqa: E731
        if plan.how is How.PARALLEL:
            fetch, fallback = ranged
            return await fill.run_ranged(fetch, fallback, store=self.store, meta=meta, on_bytes=on_bytes,
                                         superseded=superseded)
        if plan.how is How.SPLICED and (taken := splice.take(response)) is not None:
            return await fill.run_spliced(taken, store=self.store, meta=meta,
                                          read_timeout=self.settings.origin_read_timeout,
                                          on_bytes=on_bytes, superseded=superseded)

        async def body() -> AsyncIterator[bytes]:
            got = 0
            try:
                async for chunk in response.content.iter_chunked(FILL_READ):
                    got += len(chunk)
                    yield chunk
                return
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
                if rest is None:
                    raise
                broke: BaseException = e
            finally:
                response.release()
            async for chunk in rest(got, broke):
                yield chunk

        return await fill.run(body(), store=self.store, meta=meta, on_bytes=on_bytes, superseded=superseded)

    def _rest_from_origin(self, response: aiohttp.ClientResponse, source: Source,
                          reading: dict[str, bool]) -> Callable[[int, BaseException], AsyncIterator[bytes]] | None:
        """How a fill from the parent goes on when the parent breaks off
        mid-body (a cluster pod restarted): the rest of the same
        representation from the origin, by Range + If-Range on its
        validator, checked as a parallel fill checks its ranges. None when
        the answer has no length or validator to resume by."""
        length = response.content_length
        validator = if_range_validator(response.headers)
        if response.status != 200 or length is None or validator is None:
            return None
        if validator.etag is not None:
            # A strong ETag alone ties the rest to the head (If-Range sends it; a 206 carries it).
            validator = dataclasses.replace(validator, last_modified=None)

        async def rest(offset: int, error: BaseException) -> AsyncIterator[bytes]:
            if offset >= length:
                return  # every byte came: whatever broke came after the body
            self.origins.broke_off(source.route, offset, error)
            reading["parent"] = False
            headers = CIMultiDict(source.headers)
            headers["Range"] = f"bytes={offset}-{length - 1}"
            headers["If-Range"] = validator.if_range
            answer = await self.origins.client.request("GET", source.url, headers=headers, what=source.what)
            try:
                skip = 0
                why = partial_mismatch(answer.status, answer.headers, first=offset, last=length - 1, total=length,
                                       validator=validator)
                if why is not None and answer.status == 200 and answer.content_length == length \
                        and validator.mismatch(answer.headers) is None:
                    why, skip = None, offset  # an origin that ignores Range: the whole object, the head skipped
                if why is not None:
                    raise FillAborted(f"{source.what}: the parent broke off after {offset} of {length} bytes and "
                                      f"the origin's rest cannot be joined on ({why}): nothing is stored")
                async for chunk in skip_first(answer.content.iter_chunked(FILL_READ), skip):
                    yield chunk
            finally:
                answer.release()

        return rest

    def _ranged_fetch(self, write: ObjectWrite, length: int | None, source: Source, validator: Validator,
                      on_bytes: Callable[[int], None], *, streams: int, on_demand: bool,
                      landed: asyncio.Event, discarded: int):
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
                            read_timeout=self.settings.origin_read_timeout, landed=landed, discarded=discarded)
        def fallback(offset: int) -> AsyncIterator[bytes]:
            return plain_rest(get, source.headers, offset=offset, length=length or 0, validator=validator,
                              read_size=FILL_READ, what=source.what)

        return fetch, fallback



def _answer(response: aiohttp.ClientResponse, *, policy: Policy, vary: tuple[str, ...] | None, kept: Pairs,
            source: Source, fits: Callable[[int], bool], authorize: bool = False) -> Answer:
    """The facts about `response` that `fill/lead.py` decides on."""
    length = response.content_length
    return Answer(status=response.status, policy=policy, vary=vary,
                  vary_listed=", ".join(response.headers.getall("Vary", [])),
                  has_validator="ETag" in response.headers or "Last-Modified" in response.headers,
                  fits=length is None or fits(length), length=length,
                  header_bytes=header_bytes(kept), from_peer=source.peer is not None,
                  peer_says_hit=response.headers.get(CACHE_HEADER) == CacheOutcome.HIT,
                  authorized_reads=authorize, has_etag="ETag" in response.headers)
