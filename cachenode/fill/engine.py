"""The fill engine: leads a flight (one request to the source for everyone
waiting on a key) and starts the fill its answer calls for.

What to do with an answer is `fill/lead.py`'s pure decision; this module
is only the I/O around it: asking the origin or a peer, renewing a stored
object on a 304, storing a chunked object's manifest, and handing a body
to `fill/running.py`, which runs the fill (one stream, a spliced one, or
parallel ranges) in the background and stores and counts the result.
Callers above it (the request handler, hand-off, invalidation) hold this
object, never the node.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Coroutine, Mapping, Protocol

import aiohttp
import structlog
from multidict import CIMultiDict

from cachenode.counts import Counts
from cachenode.fill.assembly import Assemblies
from cachenode.fill.flights import Flight, Flights, Kind, Outcome, Source
from cachenode.fill.judged import Judged, answer_of, judge
from cachenode.fill.chunking import chunked_as, first_chunk_range, first_chunk_span, resumed_span, whole_fields
from cachenode.fill.lead import Step, decide, resume_of
from cachenode.fill.origin import Interim, forwarded_request_headers
from cachenode.fill.parallel import close_unread
from cachenode.fill.running import FillRuns, Peers
from cachenode.fill.small_gets import SmallAnswer
from cachenode.fill.verify import Digests
from cachenode.fill.upstream import Upstream
from cachenode.http.digests import carried
from cachenode.http.freshness import Policy, current_age, response_policy
from cachenode.http.headers import Pairs, describes_whole_body, renewed_by_304, stored_pairs, with_date
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.chunks import Layout, chunks_on
from nezha.config import CacheSettings, Origin
from nezha.credentials import redact_url
from nezha.errors import FillAborted, OriginError
from nezha.keys import Target

log = structlog.get_logger("nezha.cachenode")


class LeaderGone(FillAborted):
    """The request leading a flight ended before the origin answered."""


class PeerSourceFailed(LeaderGone):
    """A flight led here from a peer failed there: a read that joined it looks again (the origin), never a 502."""


# A fill asks for the whole object whatever one client asked: its own
# validators replace the client's, and Range is applied to the stored bytes.
NOT_FOR_FILLS = frozenset({"range", "if-range", "if-match", "if-none-match", "if-modified-since",
                           "if-unmodified-since"})


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

    async def adopt(self, meta: Meta, response: aiohttp.ClientResponse, target: Target, *, read_here: bool) -> None:
        """`response`, the origin's 206 of the first chunk of the object the manifest `meta` describes,
        filled as that chunk; returns once its owners are copying it (chunks/adopted.py `AdoptedChunks.adopt`). `read_here`:
        the request that led the fill reads the object here (a client's; a peer's is answered the manifest)."""


class FillEngine:
    def __init__(self, *, settings: CacheSettings, store: Store, origins: Upstream, peers: Peers,
                 counts: Counts, metrics: Metrics, via: str,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
                 replicate: Callable[[Meta, Target], None], chunks: ChunkedObjects,
                 clock: Callable[[], float] = time.time, digests: Digests | None = None) -> None:
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
        # Objects assembled from the parts signed ranged reads bring (authorize origins).
        self.parts = Assemblies(store=store, counts=counts, replicate=replicate, clock=clock)
        self._clock = clock
        self.chunks = chunks  # large objects stored as chunks across the ring
        # The fills its answers start, each running in the background until it lands.
        self.runs = FillRuns(settings=settings, store=store, origins=origins, peers=peers, counts=counts,
                             metrics=metrics, flights=self.flights, parts=self.parts, spawn=spawn,
                             replicate=replicate, digests=digests)

    def at_rest(self, task: asyncio.Task) -> bool:
        """`task` is a fill parked waiting for clients to ask for more of it
        (an on-demand fill, cachenode/fill/parallel.py): not work in progress."""
        return self.runs.at_rest(task)

    async def forget(self, keys: list[str], *, why: str) -> int:
        """Remove what this node stores for `keys`, and let no fill in progress store them; how many objects went."""
        removed = 0
        for key in keys:
            self.flights.supersede(key)
            await self.parts.forget(key, why="invalidated")
            for meta in await self.store.remove(key):  # every variant
                self.counts.gone(meta, self.store.sizes())
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
        source = source._replace(interim=None)

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
                      interim: Interim | None = None, handed: str | None = None) -> Source:
        """The origin, asked with the leading client's own fields (all but its
        validators and Range: the fill fetches the whole object for everyone;
        an `authorize` origin's caller keeps every field it may have signed);
        through the parent tier when `route` names the target to ask it for.
        `interim` forwards the origin's 1xx answers to that client; `handed`:
        the X-Nezha-Digest a peer's request carried (a relay's resume), which
        the fill checks too."""
        headers = forwarded_request_headers(client_headers, via=self.via, drop=drop)
        # A resume (the rest of a body under If-Range) asks for its range first; not through a
        # parent tier, and not when the caller's own fields go as they are (a signed read).
        resume = (resume_of(client_headers.get("Range"), client_headers.get("If-Range"))
                  if route is None and "range" in drop else None)
        return Source(url=url, what=f"origin {url}", headers=headers, ranged="Range" in client_headers, route=route,
                      interim=interim, resume=resume, handed=carried(handed))

    async def lead(self, flight: Flight, *, key: str, url: str, origin: Origin, stale: Meta | None,
                   target: Target, source: Source,
                   answer: aiohttp.ClientResponse | None = None) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        """Ask the source once for everybody waiting on `key`; the step taken
        with its answer is `fill/lead.py`'s decision, this is only its I/O.
        `answer`: the source's answer already in hand (a relayed read's, which
        becomes this node's copy, cluster/streaming_copies.py): not asked again."""
        response: aiohttp.ClientResponse | None = answer
        try:
            try:
                response, answered, source = await self._ask_resuming(source, stale, origin, answer=answer)
            except OriginError as e:
                self.flights.land(flight)
                self.counts.count(target.host, failed_fills=1)
                error = e if source.peer is None else PeerSourceFailed(str(e))  # a peer's: joiners go on
                return self._resolve_flight(flight, Outcome(Kind.FAILED, error=error)), None
            self.runs.digests.noted(target, response.status, response.headers)  # Hugging Face's, for later fills
            if answered is not None:
                # The resume's 206 stands for the object it is part of: judged and stored as its 200.
                outcome = await self._resumed_fill(flight, response, answered, key=key, url=url, origin=origin,
                                                   target=target, source=source)
                response = None  # the fill owns it now, or it was released
                return self._resolve_flight(flight, outcome), None
            judged = self._judge(response, origin=origin, source=source, stale=stale)
            if judged.decision.step is not Step.FILL:
                return await self._not_stored(flight, response, judged, key=key, origin=origin, stale=stale,
                                              source=source)
            if judged.chunk_size is not None:
                # Stored as chunks across the ring, each filled by its owners
                # when first read: this node keeps only the manifest.
                self._drop_unread(response, source)
                response = None
                meta = await self._chunked(judged, key=key, url=url, origin=origin, target=target, source=source,
                                           stale=stale)
                return self._landed(flight, Outcome(Kind.STORED, meta=meta)), None
            # Stored at once when small and whole in memory (answered as a hit), else by a fill (running.py).
            outcome = await self.runs.fill(flight, response, judged, key=key, url=url, target=target, source=source,
                                           origin=origin)
            response = None  # the fill owns it now, or it was read whole (its connection back in the pool)
            if source.peer is None and stale is not None and stale.chunk_size and outcome.kind is not Kind.FAILED:
                self.chunks.replaced(stale, None)  # its new answer is stored whole
            return self._resolve_flight(flight, outcome), None
        except BaseException as e:
            if response is not None:
                response.release()
            if not flight.resolved():
                self.flights.abort(flight, LeaderGone(f"request leading the fetch of {key} ended: {e!r}"))
            raise

    def asks_plainly(self, source: Source, origin: Origin) -> bool:
        """Whether `lead` would ask the origin with `source`'s fields alone: fill/small_gets.py may then."""
        return source.peer is None and source.route is None and source.resume is None and first_chunk_range(
            source, None, origin, chunking=self.settings.chunking(origin), spread=self.chunks.spread()) is None

    async def lead_small(self, flight: Flight, answer: SmallAnswer, *, key: str, url: str, origin: Origin,
                         target: Target, source: Source) -> Outcome | None:
        """Lead `flight` with the origin's small whole 200 in hand (fill/small_gets.py) as `lead` and
        `FillRuns.fill` lead it when they would store it at once: `store_whole`, or from memory what it could
        not store. None: `lead` would do anything else with it; nothing stored, the flight still led."""
        if len(answer.body) != answer.content_length:
            return None  # never a torn body: its client's bytes are the length its head says
        self.runs.digests.noted(target, answer.status, answer.headers)
        judged = self._judge(answer, origin=origin, source=source, stale=None)
        if judged.decision.step is not Step.FILL or judged.chunk_size is not None or not self.runs.whole_and_small(
                answer, source=source, origin=origin, authorize=judged.authorize):
            return None
        return self._resolve_flight(flight, await self.runs.fill(flight, answer, judged, key=key, url=url,
                                                                 target=target, source=source, origin=origin,
                                                                 whole=answer.body))

    async def _not_stored(self, flight: Flight, response: aiohttp.ClientResponse, judged: Judged, *, key: str,
                          origin: Origin, stale: Meta | None,
                          source: Source) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        """Land a flight whose answer `decide` does not store (every step but
        FILL): a peer's refusal, a 304 that renews `stale`, a 5xx that lets
        `stale` be served, or an answer passed on, which is returned with its
        outcome for the leading request to send."""
        step = judged.decision.step
        if step is Step.PEER_REFUSED:
            # A peer copy is all or nothing: a replica never falls back to the origin (a read that joined does).
            error = PeerSourceFailed(f"{source.what} answered {response.status} for {key}")
            response.release()
            return self._landed(flight, Outcome(Kind.FAILED, error=error)), None
        if step is Step.REVALIDATED:
            assert stale is not None
            response.release()
            meta = await self._revalidated(stale, response, key=key, now=judged.now, origin=origin)
            return self._landed(flight, Outcome(Kind.REVALIDATED, meta=meta)), None
        if step is Step.STALE_ON_ERROR:
            response.release()
            error = OriginError(f"{source.what} returned {response.status}")
            return self._landed(flight, Outcome(Kind.FAILED, error=error)), None
        # Step.PASS: the answer goes to its client(s), not stored.
        log.info("response_not_stored", key=key, reason=judged.decision.reason)
        return self._landed(flight, Outcome(Kind.PASSED)), response

    async def _ask_resuming(self, source: Source, stale: Meta | None, origin: Origin, *,
                            answer: aiohttp.ClientResponse | None = None,
                            ) -> tuple[aiohttp.ClientResponse, tuple[int, int, int] | None, Source]:
        """The source's answer, the span it brings when a resume can start from
        it (`_answered`), and the source as finally asked. A range that is not
        one to start from (not the range asked, a weak validator, a chunked
        object's size) is asked again as any fill, for the whole object (a 200
        is the whole object already: If-Range found another version)."""
        first = first_chunk_range(source, stale, origin, chunking=self.settings.chunking(origin),
                                  spread=self.chunks.spread()) if answer is None else None
        response: aiohttp.ClientResponse | None = answer if answer is not None else await self._ask(
            source, stale, first=first)
        try:
            answered = self._answered(response, source=source, stale=stale, origin=origin)
            if first is not None:
                answered = first_chunk_span(first, response.status, response.headers)
                if answered is None and response.status in (206, 416):  # not the range asked: the whole, plainly
                    response.release()  # (released again, harmlessly, if the new ask raises)
                    response = await self._ask(source, stale)
            elif source.resume is not None and answered is None and response.status == 206:
                response.release()
                source, response = source._replace(resume=None), None
                response = await self._ask(source, stale)
        except BaseException:
            if response is not None:
                response.release()
            raise
        return response, answered, source

    def _drop_unread(self, response: aiohttp.ClientResponse, source: Source) -> None:
        """Close a chunked object's first answer unread (no byte of it is stored
        here); the origin's bytes it had in flight counted as discarded."""
        if source.peer is None:
            self.metrics.origin_bytes_discarded.inc(close_unread(response))
        else:
            response.release()

    def _judge(self, response: aiohttp.ClientResponse, *, origin: Origin, source: Source,
               stale: Meta | None) -> Judged:
        """What the leader makes of the source's answer (fill/judged.py `judge`), at this node's clock."""
        return judge(response, origin=origin, source=source, stale=stale, now=self._clock(), fits=self.store.fits,
                     chunking=lambda vary, authorize: self._chunking(response, origin=origin, source=source,
                                                                     vary=vary, authorize=authorize))

    async def _chunked(self, judged: Judged, *, key: str, url: str, origin: Origin, target: Target,
                       source: Source, stale: Meta | None) -> Meta:
        """Store the manifest of an object kept as chunks across the ring; from
        the origin, its other owners copy it and a replaced version's chunks go."""
        assert judged.chunk_size is not None
        meta = await self._store_manifest(key=key, url=url, origin=origin, target=target, headers=judged.kept,
                                          now=judged.now, expires_at=judged.expires_at, policy=judged.policy,
                                          length=judged.length, chunk_size=judged.chunk_size, age=judged.age,
                                          hot=source.hot and source.peer is not None)
        if source.peer is None:
            self.replicate(meta, target)  # the manifest's other owners copy it (never the bytes)
            if stale is not None and stale.chunk_size:
                self.chunks.replaced(stale, meta)
        return meta

    def _chunking(self, response: aiohttp.ClientResponse, *, origin: Origin, source: Source,
                  vary: tuple[str, ...] | None, authorize: bool) -> tuple[int | None, int]:
        """The chunk size to store `response`'s object in across the ring and its length (fill/chunking.py)."""
        return chunked_as(response.status, response.headers, response.content_length, peer=source.peer is not None,
                          chunking=self.settings.chunking(origin), spread=self.chunks.spread(),
                          plain=not authorize and vary == () and not self.origins.answered_by_parent(response))

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
        self.counts.stored(stored, self.store.sizes())
        log.info("object_chunked", key=key, bytes=length, chunk_size=chunk_size,
                 chunks=Layout(size=length, chunk_size=chunk_size).count)
        return stored

    def _answered(self, response: aiohttp.ClientResponse, *, source: Source, stale: Meta | None,
                  origin: Origin) -> tuple[int, int, int] | None:
        """The span a resume's answer brings (first, end, object length), when the fill
        can start from it (fill/chunking.py `resumed_span`); else None."""
        if source.resume is None or stale is not None or source.peer is not None or origin.credentials == "authorize":
            return None
        return resumed_span(source.resume, response.status, response.headers, chunking=self.settings.chunking(origin),
                            spread=self.chunks.spread())

    async def _resumed_fill(self, flight: Flight, response: aiohttp.ClientResponse, span: tuple[int, int, int], *,
                            key: str, url: str, origin: Origin, target: Target, source: Source) -> Outcome:
        """The fill of the object a resume's 206 (`span`: first, end, length) is part of: that answer read into
        its place, the rest fetched around it in ranges; a chunked object's first chunk: its manifest."""
        now = self._clock()
        policy = response_policy(200, response.headers, now=now, policy_ttl=origin.default_ttl,
                                 targeted=origin.targeted_cache_control)
        # Stored as the object's 200: without the fields that describe the part
        # (Content-Range, and the part's own Content-MD5, Content-Digest, checksums).
        kept = tuple((n, v) for n, v in with_date(stored_pairs(response.headers), now)
                     if n.lower() != "content-range" and not describes_whole_body(n))
        threshold, chunk_size = self.settings.chunking(origin)
        # A first chunk's 206 of an object stored as chunks (fill/chunking.py), which fits whatever its size.
        chunked = span[0] == 0 and chunks_on(threshold, span[2]) and not self.origins.answered_by_parent(response)
        decision = decide(answer_of(response, policy=policy, vary=(), kept=kept, source=source, status=200,
                                    fits=(lambda _: True) if chunked else self.store.fits, length=span[2]),
                          stale_held=False, stale_usable_on_error=False)
        if decision.step is not Step.FILL:
            # Not storable: the leading request asks again as it asked; nobody else joins.
            log.info("response_not_stored", key=key, reason=decision.reason)
            response.release()
            return self._landed(flight, Outcome(Kind.PASSED))
        if chunked:  # the manifest here (with the whole object's fields, when a HEAD has them), this answer chunk 0
            whole = await whole_fields(self.origins, source, response.headers)
            kept = kept if whole is None else with_date(stored_pairs(whole), now)
            judged = Judged(now=now, authorize=False, policy=policy, expires_at=now + policy.ttl, kept=kept, vary=(),
                            chunk_size=chunk_size, length=span[2], age=current_age(response.headers, now),
                            decision=decision)
            meta = await self._chunked(judged, key=key, url=url, origin=origin, target=target, source=source,
                                       stale=None)
            await self.chunks.adopt(meta, response, target, read_here=source.read_here)
            self.flights.land(flight)
            return Outcome(Kind.STORED, meta=meta)
        fill = await self.runs.start(flight, response, key=key, url=url, host=target.host, headers=kept,
                                     expires_at=now + policy.ttl, policy=policy, now=now, target=target,
                                     source=source, vary=(), origin=origin, authorize=False, answered=span)
        log.info("fill_resumed", key=key, first=span[0], bytes=span[2])
        return Outcome(Kind.STREAMING, fill=fill)

    async def _ask(self, source: Source, stale: Meta | None, *, first: str | None = None) -> aiohttp.ClientResponse:
        """The source's answer to the fill's request, made conditional on what is stored (`first`: fill/chunking.py)."""
        headers = CIMultiDict(source.headers)
        if first is not None:
            headers["Range"] = first
        if source.resume is not None and stale is None and source.peer is None:
            headers["Range"] = source.resume.range
            headers["If-Range"] = source.resume.if_range
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
                self.counts.gone(meta, self.store.sizes())
        return meta
