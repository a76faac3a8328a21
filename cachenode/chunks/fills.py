"""Chunk fills: one fill per chunk per node however many ask, on the same
single-flight registry as every other fill (cachenode/fill/flights.py).

A chunk this node owns but does not hold is filled here: from a live owner
ahead of it in ring order when one holds it (a replica copies the first
owner's chunk), else from the origin with `Range` + `If-Range` on the
manifest's validator, which makes this node the chunk's first live owner:
it then has the owners behind it copy the chunk from it (`ChunkPeers.push`).
An origin answer that is not exactly those bytes of that version is
`ChunkChanged`: nothing is stored. A source that breaks off mid-chunk (an
owner killed while it sent) leaves what it sent: the next is asked for the
rest only, from the byte reached, into the same file its readers follow
(chunks/landing.py), so an owner's death mid-chunk costs the origin one
request for the missing range, however many wait on the chunk.

A node that does not own a chunk passes it on (`passing`): its clients
reading it at once share one request to its owners, read as it grows from
a temp file dropped once through (a chunk stays on its owners only).
Without it each owner sent each chunk once per client, not once per node,
and a stampede's time grew with N (docs/benchmarks.md, "Stampede").

A cold fill's first answer is chunk 0 (fill/chunking.py), whoever owns it:
the node that asked stores it as it comes, a fill on these same flights led
from that answer (chunks/adopted.py `AdoptedChunks.adopt`, through `lead`,
`run` and `store_chunk`).

Readers of a fill join its flight and are sent its bytes as they land
(`stored_or_growing`, `passing`: a `Tail` of the growing file); later ones
read the committed file. A fill whose chunk nothing will name any more
(its object invalidated or replaced meanwhile) is superseded: it finishes
for whoever reads it now, what it commits is removed, and the next read
leads a fill of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine

import aiohttp
import structlog

from cachenode.chunks.landing import Landing
from cachenode.chunks.peers import ChunkPeers, Members, Relay, owners_of
from cachenode.chunks.peers_first import PeersFirst
from cachenode.chunks.sources import Growing, Opened, Tail
from cachenode.chunks.spec import ChunkChanged, ChunkSpec, ChunkUnavailable
from cachenode.counts import Counts
from cachenode.fill.flights import Flight, Flights, Kind, Outcome
from cachenode.fill.parallel import Validator, partial_mismatch
from cachenode.fill.upstream import Upstream
from cachenode.metrics import Metrics
from cachenode.store.disk import CorruptCopy, Store
from cachenode.store.objects import Meta
from nezha.chunks import Layout, Piece, chunk_key
from nezha.errors import FillAborted, NezhaError
from nezha.keys import Target
from nezha.ring import Peer

log = structlog.get_logger("nezha.chunks")

@dataclass
class ChunkFill:
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
        self._fills: dict[Flight, ChunkFill] = {}  # every chunk fill running here, superseded ones too
        self.peers_first = PeersFirst()  # this node's clients of an object kept behind the peers reading it here

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
        # A kept fill here (the chunk a cold fill's first answer brought, chunks/adopted.py) is read as it grows too.
        if growing is None or growing.validator != validator:
            outcome = flight.outcome.result() if flight.outcome.done() else None
            if outcome is not None and outcome.error is not None and isinstance(outcome.error, ChunkChanged):
                raise outcome.error
            raise ChunkUnavailable(f"no shared read of {flight.key} to join here")
        return Tail(growing)

    @staticmethod
    async def _first_bytes(flight: Flight, fill: ChunkFill) -> None:
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

    def lead(self, ckey: str, validator: Validator) -> tuple[Flight, ChunkFill] | None:
        """A flight of chunk `ckey` led here and its fill (kept), to `run`; None when one runs already."""
        flight, leader = self.flights.lead_or_join(ckey)
        if not leader:
            return None
        fill = self._fills[flight] = ChunkFill(validator=validator, writing=asyncio.Event())
        return flight, fill

    def run(self, flight: Flight, work: Coroutine[Any, Any, Meta | None]) -> asyncio.Task:
        """`work`, the fill of `flight`, in the background: the flight lands with what it returns or raises."""
        task = self.spawn(work)
        task.add_done_callback(lambda done: self._ended(flight, done))
        return task

    def _lead_or_join(self, *, key: str, url: str, target: Target, layout: Layout, index: int,
                      validator: Validator, source: Peer | None,
                      keep: bool = True) -> tuple[Flight, ChunkFill]:
        """The flight of chunk `index` here, and its fill, started if none runs
        (`keep`: stored here, else passed on from an owner, see `passing`)."""
        ckey = chunk_key(key, index, layout.chunk_size)
        flight, leader = self.flights.lead_or_join(ckey)
        if not leader:
            fill = self._fills[flight]
            fill.joined += 1
            fill.join_seen.set()
            return flight, fill
        fill = self._fills[flight] = ChunkFill(validator=validator, writing=asyncio.Event(), keep=keep)
        self.run(flight, self._fill(flight, fill, key=key, url=url, target=target, layout=layout, index=index,
                                    source=source))
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

    async def _fill(self, flight: Flight, fill: ChunkFill, *, key: str, url: str, target: Target, layout: Layout,
                    index: int, source: Peer | None = None) -> Meta | None:
        """Fill chunk `index` here: from a live owner ahead of this node in ring order that holds it
        (one that breaks off is marked down unless its own fill failed, and the next tried), else from
        the origin (this node then its first live owner, which has the owners behind it copy it).
        Every source writes one file (chunks/landing.py): one that breaks off leaves what it sent,
        and the next is asked for the rest of the chunk only."""
        ckey, size, started = flight.key, layout.length_of(index), time.monotonic()
        owners = owners_of(self.members, key, layout)[index]
        mine = next((i for i, p in enumerate(owners) if p.id == self.node_id), None)
        spec = ChunkSpec(index=index, chunk_size=layout.chunk_size, length=layout.size, validator=fill.validator)
        ahead = [p for p in owners[:mine] if not self.relay.is_down(p)] if mine is not None else []
        if not fill.keep:
            ahead = self.relay.order(owners)  # every owner, those marked down last: they may be back
        if source is not None and source.id != self.node_id:
            ahead = [source] + [p for p in ahead if p.id != source.id]
        # No owner ahead to copy chunk 0 from: the node whose cold fill's first answer it may be comes
        # first, as a node of a wave (its flight or stored copy, or nothing), then the origin.
        adopted = self._first_answer_at(key) if fill.keep and index == 0 and not ahead else None
        ahead = [adopted] if adopted is not None else ahead
        for attempt in (1, 2):
            try:  # `_land` takes the sources it asked off `ahead`: a second attempt asks the next
                stored, sent, began = await self._land(fill, ahead, spec, ckey=ckey, url=url, target=target,
                                                       layout=layout, fed=adopted)
                break
            except CorruptCopy as e:
                # A whole copy whose bytes are not its sender's block checksums: nothing of it is kept, and
                # the chunk is asked once more, whole, of the next source (the origin after the owners ahead).
                log.warning("chunk_source_broke", source="copy refused", index=index, reason=str(e),
                            resume=attempt == 1)
                if attempt == 2:
                    raise FillAborted(f"{ckey}: {e}") from e
        owner, peer = sent if sent is not None else (None, None)
        log.info("chunk_passed" if stored is None else "chunk_filled", key=ckey, bytes=size,
                 source=peer.id if peer is not None else "origin", seconds=round(time.monotonic() - started, 3),
                 sent_on_by=owner.id if owner is not peer else None, **({"resumed_at": began} if began else {}))
        if sent is None and mine is not None:
            for behind in owners[mine + 1:]:
                self.spawn(self.peers.push(behind, target, spec))  # its result is logged there
        return stored

    async def _land(self, fill: ChunkFill, ahead: list[Peer], spec: ChunkSpec, *, ckey: str, url: str,
                    target: Target, layout: Layout,
                    fed: Peer | None = None) -> tuple[Meta | None, tuple[Peer, Peer] | None, int]:
        """The chunk into one file from the owners `ahead`, each asked for the rest from the byte the
        last reached, else the origin (for a fill, never a pass); committed for a fill. What was
        stored (None: passed on), the owner and node that sent the last bytes (None: the origin), and
        the byte the last source began at. CorruptCopy when a whole copy's checksums refuse it."""
        landing = self._landing(fill, size=layout.length_of(spec.index), host=target.host)
        try:
            sent = await self._from_owners(landing, ahead, spec, target=target, fed=fed)
            if sent is None and not fill.keep:  # a non-owner never fills a chunk from the origin: its readers
                raise ChunkUnavailable(f"no owner of {ckey} answered"  # ask on their own
                                       + (f" for the rest after {landing.written} bytes" if landing.written else ""))
            if sent is None:
                await self._from_origin(landing, ckey, url=url, target=target, layout=layout, index=spec.index)
            stored = await landing.commit(ckey, url=url, length=layout.size) if fill.keep else landing.passed()
            return stored, sent, landing.began
        finally:
            await landing.end()

    def _landing(self, fill: ChunkFill, *, size: int, host: str) -> Landing:
        """The file `fill`'s sources write in turn (chunks/landing.py)."""
        return Landing(fill=fill, size=size, host=host, store=self.store, metrics=self.metrics, counts=self.counts,
                       clock=self._clock)

    async def _from_owners(self, landing: Landing, ahead: list[Peer], spec: ChunkSpec, *, target: Target,
                           fed: Peer | None = None) -> tuple[Peer, Peer] | None:
        """The rest of the chunk, from the byte `landing` reached, from the first of `ahead` that sends
        it: that owner, and the node that sent it (a node of the chunk's wave it sent this node to, or
        itself); None when none did."""
        fill = landing.fill
        asked, again = dataclasses.replace(spec, role="fill" if fill.keep else "pass"), set()
        while ahead:
            owner, at = ahead.pop(0), landing.written
            piece = Piece(index=spec.index, offset=at, length=landing.size - at)  # the whole chunk, or its rest
            # `fed`: no owner, asked for its flight of the chunk or its stored copy, never to start one.
            opened = await self._ask(owner, target, dataclasses.replace(spec, role="fed") if owner is fed else asked,
                                     piece)
            if opened is None:
                continue
            assert opened.response is not None
            peer = opened.peer or owner  # a node of the chunk's wave the owner sent this node to, or the owner
            try:
                await landing.take(opened.response, source=opened.source, peer=peer)
            except FillAborted as e:
                if landing.spoiled:
                    raise
                # The rest is asked of the next source, from the byte reached: an owner's fill always has
                # one (the origin); a chunk passed on only while owners are left, else its readers go on alone.
                log.warning("chunk_source_broke", source=opened.source, index=spec.index, reason=str(e),
                            kept=landing.written, resume=fill.keep or bool(ahead))
                # Down unless its own fill failed: then an owner ahead's flight goes on from its next source
                # (the origin, for a first owner), and this fill follows it there once more rather than ask
                # the origin itself: one origin request for the chunk, not one per owner behind.
                if await self.peers.broke_off(peer, target, spec, str(e)) and fill.keep and peer is owner \
                        and owner.id not in again:
                    again.add(owner.id)
                    ahead.insert(0, owner)
                continue
            return owner, peer
        return None

    def _first_answer_at(self, key: str) -> Peer | None:
        """The node that holds chunk 0 of `key` when a cold fill's first answer brought it there
        (chunks/adopted.py): the key's first owner in the ring, which leads its fills, unless that is
        this node or marked down. Its copy reaches chunk 0's first owner by a push (`ChunkPeers.push`)
        before the manifest is answered; but the manifest is stored, and replicated to the key's other
        owners, before that push is sent, and a reader that learned of it there meanwhile had chunk 0's
        first owner fill the chunk from the origin while the key's owner held it (1.125 S, one run in
        about ten of the stampede benchmark's `shipped-chunks`)."""
        first = self.members.owners(key, 1)
        if not first or first[0].id == self.node_id or self.relay.is_down(first[0]):
            return None
        return first[0]

    async def _ask(self, owner: Peer, target: Target, spec: ChunkSpec, piece: Piece) -> Opened | None:
        """`owner`'s answer for a whole chunk, or its rest. A whole pass may be sent on to a node of the
        chunk's wave there (chunks/feeders.py): then that node's, or, when it has no flight of the chunk
        any more, the owner's again, asked to answer it itself."""
        answer = await self.peers.ask(owner, target, spec, piece)
        if not isinstance(answer, Peer):
            return answer
        fed = await self.peers.ask(answer, target, dataclasses.replace(spec, role="fed"), piece)
        if isinstance(fed, Opened):
            return fed
        answer = await self.peers.ask(owner, target, dataclasses.replace(spec, role="pass-direct"), piece)
        return answer if isinstance(answer, Opened) else None

    async def feeding(self, *, key: str, layout: Layout, index: int, validator: Validator) -> Meta | Tail | None:
        """Chunk `index` of `key` for a node its owner sent here (chunks/feeders.py): as stored here, or
        as this node's flight of it (a pass or a fill) writes it, once it writes; None when this node has
        neither (its flight ended), and the asker goes back to the owner. Never starts a flight."""
        stored = self.held(key, index, layout, validator)
        if stored is not None:
            return stored
        flight = self.flights.get(chunk_key(key, index, layout.chunk_size))
        fill = self._fills.get(flight) if flight is not None else None
        if flight is None or fill is None or fill.validator != validator:
            return None
        await self._first_bytes(flight, fill)
        growing = fill.growing
        if growing is not None and growing.validator == validator:
            return Tail(growing)
        return self.held(key, index, layout, validator)

    async def _from_origin(self, landing: Landing, ckey: str, *, url: str, target: Target, layout: Layout,
                           index: int) -> None:
        """The rest of chunk `index` from the origin, from the byte `landing` reached (all of it when
        no owner sent any), pinned to the manifest's version by `If-Range`: ChunkChanged when the
        answer is not exactly those bytes of that version, and nothing is stored, the bytes kept
        from the owners thrown away with the rest."""
        validator, at = landing.fill.validator, landing.written
        first, last = layout.span(index)
        headers = {"Range": f"bytes={first + at}-{last}", "If-Range": validator.if_range, "Via": self.via}
        try:
            response = await self.upstream.request("GET", url, headers=headers, what=f"origin {url}")
        except NezhaError:
            if not landing.opened:  # else counted as the fill ends, failed
                self.counts.count(target.host, failed_fills=1)  # as a whole object's fill whose origin did not answer
            raise
        why = partial_mismatch(response.status, response.headers, first=first + at, last=last, total=layout.size,
                               validator=validator)
        if why is not None:
            response.release()
            log.warning("chunk_changed", key=ckey, url=url, reason=why, thrown_away=at)
            kept = f", and the {at} bytes its owners had sent are thrown away" if at else ""
            raise ChunkChanged(f"origin {url} for chunk {index} ({first + at}-{last}) {why}: the object "
                               f"changed since it was chunked; nothing stored{kept}")
        if at:
            log.info("chunk_resumed", key=ckey, source="origin", at=at, bytes=last + 1 - first - at)
        await landing.take(response, source=f"origin {url}", origin=True)

    async def store_chunk(self, fill: ChunkFill, ckey: str, response: aiohttp.ClientResponse, *, source: str,
                          url: str, host: str, size: int, length: int) -> Meta:
        """Chunk `ckey` from `response`, the origin's answer for all of its `size` bytes (chunks/adopted.py),
        committed; FillAborted (nothing stored) when it breaks off, runs short or long."""
        landing = self._landing(fill, size=size, host=host)
        try:
            await landing.take(response, source=source, origin=True)
            return await landing.commit(ckey, url=url, length=length)
        finally:
            await landing.end()
