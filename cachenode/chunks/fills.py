"""Chunk fills: one fill per chunk per node however many ask, on the same
single-flight registry as every other fill (cachenode/fill/flights.py).

A chunk this node owns but does not hold is filled here: from a live owner
ahead of it in ring order when one holds it (a replica copies the first
owner's chunk), else from the origin with `Range` + `If-Range` on the
manifest's validator, which makes this node the chunk's first live owner:
it then has the owners behind it copy the chunk from it (`ChunkPeers.push`).
An origin answer that is not exactly those bytes of that version is
`ChunkChanged`: nothing is stored.

A node that does not own a chunk passes it on (`passing`): its clients
reading it at once share one request to its owners, read as it grows from
a temp file dropped once through (a chunk stays on its owners only).
Without it each owner sent each chunk once per client, not once per node,
and a stampede's time grew with N (docs/benchmarks.md, "Stampede").

A cold fill's first answer is chunk 0 (fill/chunking.py), whoever owns it:
the node that asked stores it as it comes (`adopt`) and the chunk's owners
copy it from there as it grows, before any reader learns of the manifest;
the copy of a node that owns none of the chunk goes once they hold it and
the reads of its object here have passed it (chunks/kept.py).

Readers of a fill join its flight and are sent its bytes as they land
(`stored_or_growing`, `passing`: a `Tail` of the growing file); later ones
read the committed file. A fill whose chunk nothing will name any more
(its object invalidated or replaced meanwhile) is superseded: it finishes
for whoever reads it now, what it commits is removed, and the next read
leads a fill of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine

import aiohttp
import structlog

from cachenode.chunks.kept import Kept, KeptChunks
from cachenode.chunks.peers import ChunkPeers, Members, Relay, owners_of
from cachenode.chunks.sources import Growing, Tail
from cachenode.chunks.spec import CHUNK_LIFETIME, ChunkChanged, ChunkSpec, ChunkUnavailable
from cachenode.counts import Counts
from cachenode.fill.running import FILL_READ
from cachenode.fill.flights import Flight, Flights, Kind, Outcome
from cachenode.fill.parallel import Validator, partial_mismatch
from cachenode.fill.upstream import Upstream
from cachenode.metrics import Metrics
from cachenode.store.disk import CorruptCopy, Store
from cachenode.store.objects import Meta, NotStored, close_reader
from nezha.chunks import Layout, Piece, chunk_key
from nezha.errors import FillAborted, NezhaError
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import BLOCKS_HEADER, ReplicateResult

log = structlog.get_logger("nezha.chunks")

# How long an adopted chunk 0 (`ChunkFills.adopt`) waits for its first owner to ask for its copy before
# its manifest is answered: a round trip or two on a live ring.
ADOPT_WAIT = 1.0


@dataclass
class _ChunkFill:
    """What a chunk fill's readers need besides its flight: the version it
    fetches, whether its file has started to grow, and the file while it grows."""

    validator: Validator
    writing: asyncio.Event  # set once the fill's chunk file starts growing
    growing: Growing | None = None
    keep: bool = True  # False: a non-owner passing the chunk on, its temp file dropped once through
    joined: int = 0  # readers that joined it (an adopted chunk's owners, asking for their copies)
    join_seen: asyncio.Event = field(default_factory=asyncio.Event)


class ChunkFills:
    def __init__(self, *, node_id: str, store: Store, upstream: Upstream, members: Members, peers: ChunkPeers,
                 relay: Relay, counts: Counts, metrics: Metrics, via: str,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
                 clock: Callable[[], float] = time.time) -> None:
        self.node_id = node_id
        self.store = store
        self.upstream = upstream
        self.members = members
        self.peers = peers
        self.relay = relay
        self.counts = counts
        self.metrics = metrics
        self.via = via
        self.spawn = spawn  # background work the node waits for (settled) and cancels (stop)
        self._clock = clock
        # Chunk keys only: a registry of their own, so the node's fills in
        # flight (/readyz, the cluster's settling) stay whole objects' fills.
        self.flights = Flights()
        self._fills: dict[Flight, _ChunkFill] = {}  # every chunk fill running here, superseded ones too
        self.kept = KeptChunks()  # adopted chunks 0 this node owns none of, kept for the reads here

    def running(self, key: str, index: int, layout: Layout) -> bool:
        """Whether a flight of chunk `index` of `key` runs here: a fill whose
        source broke off goes on from the next one in the same flight."""
        return self.flights.get(chunk_key(key, index, layout.chunk_size)) is not None

    def held(self, key: str, index: int, layout: Layout, validator: Validator) -> Meta | None:
        """Chunk `index` of `key` as stored here, if it is of the version `validator` names."""
        meta = self.store.lookup(chunk_key(key, index, layout.chunk_size))
        return meta if meta is not None and validator.mismatch(dict(meta.headers)) is None else None

    async def local(self, *, key: str, url: str, target: Target, layout: Layout, index: int,
                    validator: Validator, source: Peer | None = None) -> Meta:
        """Chunk `index` of `key` from this node's store, filled first when it
        is missing or of another version; one fill per chunk however many
        ask at once."""
        meta = self.held(key, index, layout, validator)
        if meta is not None:
            return meta
        flight, _ = self._lead_or_join(key=key, url=url, target=target, layout=layout, index=index,
                                       validator=validator, source=source)
        return await self._landed(flight)

    async def stored_or_growing(self, *, key: str, url: str, target: Target, layout: Layout, index: int,
                                validator: Validator, source: Peer | None = None) -> Meta | Tail:
        """Chunk `index` of `key` as stored here; else, once this node's fill
        of it (started if none runs) writes its first byte, that fill to read
        as it grows, so a reader waits for bytes, not for the whole chunk.
        Raises what the fill raises when it fails before writing."""
        stored = self.held(key, index, layout, validator)
        if stored is not None:
            return stored
        flight, fill = self._lead_or_join(key=key, url=url, target=target, layout=layout, index=index,
                                          validator=validator, source=source)
        await self._first_bytes(flight, fill)
        growing = fill.growing
        if growing is not None and growing.validator == validator:
            return Tail(growing)  # its descriptor taken now, before the fill can close its own
        return await self._landed(flight)

    async def passing(self, *, key: str, url: str, target: Target, layout: Layout, index: int,
                      validator: Validator) -> Tail:
        """Chunk `index` of `key`, which this node does not own, as one
        request to its owners shared by every reader here meanwhile: the
        first reader's request is the flight, later ones join it and read
        its temp file as it grows. Nothing is stored. ChunkUnavailable when
        no owner answered (or the flight ended before this reader could
        join its bytes): the reader asks on its own."""
        flight, fill = self._lead_or_join(key=key, url=url, target=target, layout=layout, index=index,
                                          validator=validator, source=None, keep=False)
        await self._first_bytes(flight, fill)
        growing = fill.growing
        # A kept fill here (the chunk a cold fill's first answer brought, `adopt`) is read as it grows too.
        if growing is None or growing.validator != validator:
            outcome = flight.outcome.result() if flight.outcome.done() else None
            if outcome is not None and outcome.error is not None and isinstance(outcome.error, ChunkChanged):
                raise outcome.error
            raise ChunkUnavailable(f"no shared read of {flight.key} to join here")
        return Tail(growing)

    async def adopt(self, response: aiohttp.ClientResponse, *, key: str, url: str, target: Target, layout: Layout,
                    validator: Validator, read_here: bool) -> None:
        """Chunk 0 of `key` from `response`: the origin's 206 to the first
        request of the object's cold fill, which asked for the first chunk's
        range (fill/chunking.py), so that the answer that told the object's
        size is stored, not closed unread. Filled here as a chunk fill is,
        whoever owns it: its first other owner is asked at once to copy it
        from this node as it grows, the owners behind that one to copy it
        from there once it holds it (this node's link sends one copy), and a
        copy here that no owner's place names goes then, once the reads here
        from now on have passed it, the leading request's first when it is
        `read_here` (chunks/kept.py). Returns once the
        first has asked (at most ADOPT_WAIT): a reader told of the manifest
        after that finds its copy under way, where it would otherwise fill
        chunk 0 from the origin."""
        address = self.members.snapshot.nodes.get(self.node_id)  # as the ring names this node to its peers
        flight, leader = self.flights.lead_or_join(chunk_key(key, 0, layout.chunk_size))
        if not leader:  # a fill of it runs here already (a peer's read came first): that one is its fill
            response.release()
            return
        fill = self._fills[flight] = _ChunkFill(validator=validator, writing=asyncio.Event())
        owners = owners_of(self.members, key, layout)[0]
        others = [p for p in owners if p.id != self.node_id] if address is not None else []
        spec = ChunkSpec(index=0, chunk_size=layout.chunk_size, length=layout.size, validator=validator,
                         source=Peer(self.node_id, address) if address is not None else None)
        first = self.spawn(self.peers.push(others[0], target, spec)) if others else None
        task = self.spawn(self._adopted(flight, fill, response, url=url, target=target, layout=layout))
        task.add_done_callback(lambda done: self._ended(flight, done))
        if first is not None:
            drop = self.kept.keep(flight.key, read_here=read_here) if len(others) == len(owners) else None
            self.spawn(self._copied_behind(task, first, others, target, spec, drop=drop))
        deadline = time.monotonic() + ADOPT_WAIT
        while first is not None and not fill.joined and not first.done() and time.monotonic() < deadline:
            fill.join_seen.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fill.join_seen.wait(), timeout=0.05)

    async def _adopted(self, flight: Flight, fill: _ChunkFill, response: aiohttp.ClientResponse, *, url: str,
                       target: Target, layout: Layout) -> Meta:
        """Store chunk 0 from the first answer (`adopt`)."""
        started, size = time.monotonic(), layout.length_of(0)
        stored = await self._store_chunk(fill, flight.key, response, source=f"origin {url}", url=url,
                                         host=target.host, size=size, length=layout.size, origin=True)
        assert stored is not None  # a kept fill
        log.info("chunk_filled", key=flight.key, bytes=size, source="origin", first_answer=True,
                 seconds=round(time.monotonic() - started, 3))
        return stored

    async def _copied_behind(self, adopted: asyncio.Task, first: asyncio.Task, others: list[Peer], target: Target,
                             spec: ChunkSpec, *, drop: Kept | None) -> None:
        """Once the first other owner of an adopted chunk holds it, have the
        owners behind it copy it from there (from here, if it could not);
        then, `drop`: this node owns none of the chunk, its copy goes once
        the reads here passed it (kept when no owner could copy it: then
        it is the only one)."""
        copied = (await asyncio.gather(first, return_exceptions=True))[0] == ReplicateResult.COPIED
        source = others[0] if copied else spec.source
        behind = [await self.peers.push(p, target, dataclasses.replace(spec, source=source)) for p in others[1:]]
        stored = (await asyncio.gather(adopted, return_exceptions=True))[0]  # an error: nothing stored here
        if drop is not None and isinstance(stored, Meta) and (copied or ReplicateResult.COPIED in behind):
            read = await self.kept.read(drop)
            if await self.store.remove_one(stored):
                self.counts.gone(stored, self.store.sizes())
                log.info("chunk_dropped", key=stored.key, reason="its owners hold it", reads_through=read)
        if drop is not None:
            self.kept.release(drop)

    @staticmethod
    async def _first_bytes(flight: Flight, fill: _ChunkFill) -> None:
        """Until `fill`'s file starts growing, or its flight ends first."""
        waiter = asyncio.ensure_future(fill.writing.wait())
        try:
            await asyncio.wait({flight.outcome, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    @staticmethod
    async def _landed(flight: Flight) -> Meta:
        """What the chunk's flight stored; what its fill raised when it failed.
        A reader that goes away leaves the fill running for the others (and the next read)."""
        outcome = await asyncio.shield(flight.outcome)
        if outcome.kind is Kind.FAILED:
            assert outcome.error is not None
            raise outcome.error
        assert outcome.meta is not None
        return outcome.meta

    def _lead_or_join(self, *, key: str, url: str, target: Target, layout: Layout, index: int,
                      validator: Validator, source: Peer | None,
                      keep: bool = True) -> tuple[Flight, _ChunkFill]:
        """The flight of chunk `index` here, and its fill, started if none runs
        (`keep`: stored here, else passed on from an owner, see `passing`)."""
        ckey = chunk_key(key, index, layout.chunk_size)
        flight, leader = self.flights.lead_or_join(ckey)
        if not leader:
            fill = self._fills[flight]
            fill.joined += 1
            fill.join_seen.set()
            return flight, fill
        fill = self._fills[flight] = _ChunkFill(validator=validator, writing=asyncio.Event(), keep=keep)
        task = self.spawn(self._fill(flight, fill, key=key, url=url, target=target, layout=layout, index=index,
                                     source=source))
        task.add_done_callback(lambda done: self._ended(flight, done))
        return flight, fill

    def _ended(self, flight: Flight, task: asyncio.Task) -> None:
        """A chunk fill ended: its flight lands with what it stored or why it
        failed; what a superseded one stored is removed."""
        self.flights.land(flight)  # not a flight started after this one was superseded
        self._fills.pop(flight, None)
        if task.cancelled():
            flight.resolve(Outcome(Kind.FAILED, error=FillAborted(f"the fill of {flight.key} was cancelled")))
            return
        error = task.exception()
        if error is not None:
            if not isinstance(error, NezhaError):
                log.error("chunk_fill_crashed", key=flight.key, error=f"{type(error).__name__}: {error}")
                error = FillAborted(f"the fill of {flight.key} crashed: {type(error).__name__}: {error}")
            flight.resolve(Outcome(Kind.FAILED, error=error))
            return
        meta: Meta | None = task.result()
        if meta is None:  # a chunk passed on, not stored
            flight.resolve(Outcome(Kind.PASSED))
            return
        flight.resolve(Outcome(Kind.STORED, meta=meta))
        if flight.superseded:
            self.spawn(self._drop_late(meta))

    async def _drop_late(self, meta: Meta) -> None:
        """A chunk fill superseded by its object's invalidation finished: remove what it committed."""
        if await self.store.remove_one(meta):
            self.counts.gone(meta, self.store.sizes())
            log.info("chunk_dropped", key=meta.key, reason="its object was invalidated or replaced meanwhile")

    def supersede(self, matches: Callable[[str, Validator], bool]) -> None:
        """Supersede every chunk fill running here whose chunk key and version
        `matches`: nothing will name what it fetches. It finishes for whoever
        reads it now (a peer may be reading it as it grows), what it commits
        is removed, and the next read of its chunk leads a fill of its own."""
        for flight, fill in list(self._fills.items()):
            if self.flights.get(flight.key) is flight and matches(flight.key, fill.validator):
                self.flights.supersede(flight.key)

    async def _fill(self, flight: Flight, fill: _ChunkFill, *, key: str, url: str, target: Target, layout: Layout,
                    index: int, source: Peer | None = None) -> Meta | None:
        """Fill chunk `index` here: from a live owner ahead of this node in ring order that holds it
        (one that breaks off is marked down unless its own fill failed, and the next tried), else from
        the origin (this node then its first live owner, which has the owners behind it copy it)."""
        ckey, validator = flight.key, fill.validator
        size = layout.length_of(index)
        started = time.monotonic()
        owners = owners_of(self.members, key, layout)[index]
        mine = next((i for i, p in enumerate(owners) if p.id == self.node_id), None)
        spec = ChunkSpec(index=index, chunk_size=layout.chunk_size, length=layout.size, validator=validator)
        ahead = [p for p in owners[:mine] if not self.relay.is_down(p)] if mine is not None else []
        if not fill.keep:
            ahead = self.relay.order(owners)  # every owner, those marked down last: they may be back
        if source is not None and source.id != self.node_id:
            ahead = [source] + [p for p in ahead if p.id != source.id]
        for n, peer in enumerate(ahead, 1):
            opened = await self.peers.ask(peer, target, spec, Piece(index=index, offset=0, length=size))
            if opened is None:
                continue
            assert opened.response is not None
            try:
                stored = await self._store_chunk(fill, ckey, opened.response, source=opened.source, peer=peer,
                                                 url=url, host=target.host, size=size, length=layout.size,
                                                 origin=False)
            except FillAborted as e:
                # The chunk is asked again of the next source, whole: an owner's fill always has one (the
                # origin); a chunk passed on only while owners are left, else its readers go on alone.
                log.warning("chunk_source_broke", source=opened.source, index=index, reason=str(e),
                            resume=fill.keep or n < len(ahead))
                await self.peers.broke_off(peer, target, spec, str(e))  # down unless its own fill failed
                continue
            log.info("chunk_passed" if stored is None else "chunk_filled", key=ckey, bytes=size, source=peer.id,
                     seconds=round(time.monotonic() - started, 3))
            return stored
        if not fill.keep:  # a non-owner never fills a chunk from the origin: its readers ask on their own
            raise ChunkUnavailable(f"no owner of {ckey} answered")
        stored = await self._from_origin(fill, ckey, url=url, target=target, layout=layout, index=index)
        log.info("chunk_filled", key=ckey, bytes=size, source="origin", seconds=round(time.monotonic() - started, 3))
        if mine is not None:
            for behind in owners[mine + 1:]:
                self.spawn(self.peers.push(behind, target, spec))  # its result is logged there
        return stored

    async def _from_origin(self, fill: _ChunkFill, ckey: str, *, url: str, target: Target, layout: Layout,
                           index: int) -> Meta:
        """Chunk `index` from the origin, pinned to the manifest's version by
        `If-Range`: ChunkChanged (nothing stored) when the answer is not exactly
        those bytes of that version."""
        validator, size = fill.validator, layout.length_of(index)
        first, last = layout.span(index)
        headers = {"Range": f"bytes={first}-{last}", "If-Range": validator.if_range, "Via": self.via}
        try:
            response = await self.upstream.request("GET", url, headers=headers, what=f"origin {url}")
        except NezhaError:
            self.counts.count(target.host, failed_fills=1)  # as a whole object's fill whose origin did not answer
            raise
        why = partial_mismatch(response.status, response.headers, first=first, last=last, total=layout.size,
                               validator=validator)
        if why is not None:
            response.release()
            log.warning("chunk_changed", key=ckey, url=url, reason=why)
            raise ChunkChanged(f"origin {url} for chunk {index} ({first}-{last}) {why}: the object "
                               f"changed since it was chunked; nothing stored")
        stored = await self._store_chunk(fill, ckey, response, source=f"origin {url}", url=url, host=target.host,
                                         size=size, length=layout.size, origin=True)
        assert stored is not None  # an owner's fill keeps what it fetched
        return stored

    async def _store_chunk(self, fill: _ChunkFill, ckey: str, response: aiohttp.ClientResponse, *, source: str,
                           peer: Peer | None = None,
                           url: str, host: str, size: int, length: int, origin: bool) -> Meta | None:
        """Write `response`'s body, exactly `size` bytes, as chunk `ckey` and commit it (None, and
        nothing committed, for a chunk passed on: `fill.keep` False); FillAborted (nothing stored)
        when it breaks off, runs short or long."""
        growing: Growing | None = None
        validator = fill.validator
        # Counted as every fill is (fill/running.py): in flight, its duration by source and outcome, a failure.
        # A chunk passed on is a relay, not a fill: not counted.
        started, outcome, counted = time.monotonic(), "failed", fill.keep
        if counted:
            self.metrics.fills_in_flight.inc()
        try:
            async with self.store.writing(reserve=size) as write:
                temp = write.temp
                # Readers of the chunk meanwhile read it as it grows (`stored_or_growing`).
                growing = fill.growing = Growing(temp=temp, validator=validator, peer=peer)
                fill.writing.set()  # whoever waits for the fill's first byte
                async for data in response.content.iter_chunked(FILL_READ):
                    if temp.written + len(data) > size:
                        raise FillAborted(f"{source} sent more than the {size} bytes of {ckey}")
                    await self.store.write(temp, data)
                    growing.moved.set()
                    if origin:
                        self.metrics.bytes_from_origin.inc(len(data))
                        self.counts.count(host, bytes_from_origin=len(data), metrics=False)
                if temp.written != size:
                    raise FillAborted(f"{source} sent {temp.written} of the {size} bytes of {ckey}")
                if not fill.keep:
                    outcome = "passed"  # through to its readers, who hold descriptors of their own
                    return None
                stored = await self._commit(write, validator, ckey, url=url, host=host, length=length, source=source,
                                            expect=None if origin else response.headers.get(BLOCKS_HEADER))
                outcome = "stored"
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise FillAborted(f"{source} broke off {ckey}: {type(e).__name__}: {e}") from e
        except NotStored:
            outcome = "not_stored"  # whole, but not kept (larger than the store): no failed fill, as in fill/running.py
            raise
        finally:
            if counted:
                self.metrics.fills_in_flight.dec()
                self.metrics.fill_duration.labels(source="origin" if origin else "peer",
                                                  outcome=outcome).observe(time.monotonic() - started)
            if counted and outcome == "failed":
                self.counts.count(host, failed_fills=1)
            response.release()
            if growing is not None:
                self._stop_growing(fill, growing)
        self.counts.stored(stored, self.store.sizes())
        return stored

    async def _commit(self, write, validator: Validator, ckey: str, *, url: str, host: str, length: int, source: str,
                      expect: str | None) -> Meta:
        """Commit a whole chunk's temp file as `ckey`. `length`: the whole
        object's, so a hand-off can place the chunk without the manifest.
        A peer's copy (`expect`: the sender's block checksums) is committed
        only if its bytes give them; FillAborted when they do not."""
        now = self._clock()
        pairs = tuple((n, v) for n, v in (("ETag", validator.etag), ("Last-Modified", validator.last_modified))
                      if v is not None)
        try:
            return await write.commit(Meta(key=ckey, url=url, host=host, size=0, headers=pairs, stored_at=now,
                                           expires_at=now + CHUNK_LIFETIME, length=length), expect=expect)
        except CorruptCopy as e:
            raise FillAborted(f"{source}: {e}") from e

    @staticmethod
    def _stop_growing(fill: _ChunkFill, growing: Growing) -> None:
        """A chunk file's growth ended (whole or not): its readers are woken, later ones no longer find it."""
        growing.ended = True
        growing.moved.set()
        if fill.growing is growing:
            fill.growing = None
        close_reader(growing.temp)  # readers hold duplicates of their own
