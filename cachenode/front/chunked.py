"""Chunked objects: reading them for a client, and serving, filling, copying and handing off one chunk.

An object at least `chunk_threshold` long is stored as chunks (nezha/chunks.py
says which bytes each holds, under which key and on which nodes). The owner
of the object's key stores a manifest (`Meta.chunk_size`, `Meta.length`, the
origin's headers, an empty data file; fill/engine.py); each chunk is an
object of its own on the owners of its chunk key.

Reading (`ChunkReads.send`): the node answering the client, whichever it is,
writes the bytes the client asked for in order, chunk by chunk. Each needed
chunk is asked of its owners (a peer GET of the object's URL with
CHUNK_HEADER and a Range inside that chunk), `WINDOW` chunks ahead of the one
being written, so cold chunks fill on their owners in parallel while the
client reads. A peer's bytes go socket to socket by splice where the
transports allow, else in `read_size` pieces; a chunk this node holds goes
out by sendfile: nothing holds a chunk in memory. A source that breaks off
mid-chunk is resumed from the same byte elsewhere (`_write`).

Filling (`ChunkReads.local_chunk`): one fill per chunk per node however many
ask, read to the chunk's file; its readers (a peer's chunk request, or this
node's own client when it is the chunk's filling owner) are sent its bytes
as they land (`_send_tail`), and later ones read the committed file. A chunk is
filled from the origin by its first live owner only, with `Range` +
`If-Range` on the manifest's strong validator; an owner behind it copies it
from an owner ahead (pushed there after the origin fill, `_push`). An origin
answer that is not exactly those bytes of the manifest's version (a 200,
another ETag, a wrong Content-Range) is `ChunkChanged`: nothing is stored,
the reader's client gets a broken response (never a mix of two versions),
and the manifest is invalidated so the next request starts again from the
origin's current answer.

When no owner of a chunk answers, the reading node takes the chunk's bytes
from the origin itself under the same validator (not stored): a job never
fails because a cache node did. A node leaving the ring hands each chunk it
holds to the chunk's owners under the new ring (`hand_off`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine

import aiohttp
import structlog
from aiohttp import web

from cachenode.counts import Counts
from cachenode.cluster.peer_auth import peer_auth
from cachenode.cluster.view import ClusterView
from cachenode.fill.engine import FILL_READ
from cachenode.fill.parallel import Validator, partial_mismatch
from cachenode.fill.upstream import Upstream
from cachenode.front.access import access
from cachenode.front.exact_head import ExactResponse
from cachenode.front.relay import PeerRelay
from cachenode.front.respond import BrokenStream, origin_failure
from cachenode.http.conditionals import parse_range
from cachenode.kernel import splice
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, TempObject, close_reader
from nezha.chunks import Layout, Piece, chunk_key, chunk_of, place
from nezha.config import CacheSettings, parse_hostport
from nezha.errors import FillAborted, NezhaError, OriginError
from nezha.keys import Target, target_of
from nezha.ring import Peer
from nezha.wire import (CHUNK_HEADER, ORIGIN_ERROR_HEADER, PEER_HEADER, SCHEME_HEADER, SERVED_BY_HEADER,
                        ReplicateResult, replicate_failed)

log = structlog.get_logger("nezha.chunks")

# Chunks asked of their owners ahead of the one being written to the client:
# enough to keep several owners filling (or sending) at once, few enough that
# a client that stops reading holds only this many open answers.
WINDOW = 4
# Times the rest of one piece is asked again after its source broke off mid-piece.
RESUMES = 3
# A stored chunk is never judged by freshness: it is one version's bytes,
# checked against the manifest's validator on every read. This only dates it.
CHUNK_LIFETIME = 365 * 24 * 3600.0


class ChunkChanged(FillAborted):
    """The origin's answer for a chunk is not of the manifest's version: the object changed."""


class ChunkUnavailable(NezhaError):
    """No owner of a chunk, nor the origin, could send it."""


@dataclass(frozen=True)
class ChunkSpec:
    """What a peer's chunk request names (CHUNK_HEADER): chunk `index` of an
    object of `length` bytes cut `chunk_size` long, of the version `validator` names."""

    index: int
    chunk_size: int
    length: int
    validator: Validator
    # A node that holds the chunk but is no longer in the ring (one handing
    # its chunks off on scale-down): asked first when the chunk is filled.
    source: Peer | None = None

    def header(self) -> str:
        spec = {"index": self.index, "chunk_size": self.chunk_size, "length": self.length,
                "etag": self.validator.etag, "last_modified": self.validator.last_modified}
        if self.source is not None:
            spec["from"] = {"id": self.source.id, "address": self.source.address}
        return json.dumps(spec)

    @classmethod
    def parse(cls, value: str) -> "ChunkSpec":
        """Raises ValueError naming what is wrong."""
        try:
            raw = json.loads(value)
            index, chunk_size, length = int(raw["index"]), int(raw["chunk_size"]), int(raw["length"])
            etag, last_modified = raw.get("etag"), raw.get("last_modified")
            source = None
            if "from" in raw:
                address = str(raw["from"]["address"])
                parse_hostport(address, field="from")
                source = Peer(str(raw["from"]["id"]), address)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{CHUNK_HEADER} {value[:200]!r} is not a chunk request: {e}") from e
        if etag is None and last_modified is None:
            raise ValueError(f"{CHUNK_HEADER} names no validator: a chunk is only ever of one version")
        layout = Layout(size=length, chunk_size=chunk_size)  # ValueError for nonsense sizes
        if not 0 <= index < layout.count:
            raise ValueError(f"chunk {index} of an object of {layout.count} chunks")
        return cls(index=index, chunk_size=chunk_size, length=length,
                   validator=Validator(etag=etag, last_modified=last_modified), source=source)

    @property
    def layout(self) -> Layout:
        return Layout(size=self.length, chunk_size=self.chunk_size)


def manifest_validator(meta: Meta) -> Validator:
    """The validator every chunk of `meta`'s object is fetched and checked
    under: its strong ETag alone when it has one (If-Range sends it; a 206
    carries it), else its Last-Modified (fill/parallel.py if_range_validator)."""
    etag = meta.etag if meta.etag is not None and not meta.etag.startswith("W/") else None
    return Validator(etag=etag, last_modified=None if etag is not None else meta.last_modified)


class _Opened:
    """One piece of the read, its source already asked: a peer's or the
    origin's answer (`response`), or a file of this node's store (`meta`)."""

    def __init__(self, piece: Piece, *, response: aiohttp.ClientResponse | None = None,
                 meta: Meta | None = None, growing: "_Tail | None" = None, source: str,
                 peer: Peer | None = None) -> None:
        self.piece = piece
        self.response = response
        self.meta = meta
        self.growing = growing  # a chunk this node is filling now, read as it grows
        self.source = source
        self.peer = peer  # the owner answering, when it is a peer

    def close(self) -> None:
        if self.response is not None:
            self.response.release()
        if self.growing is not None:
            self.growing.close()


@dataclass
class _Growing:
    """A chunk being written to this node's disk: a peer asking for it reads
    the temp file as it grows (`temp.written`), woken by `moved`, instead of
    waiting for the whole chunk."""

    temp: TempObject
    validator: Validator
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False


class _Tail:
    """One reader of a chunk being written here (`_Growing`): its own
    descriptor of the temp file, taken at once, for the fill closes its own
    when it ends and the file's name changes (commit) or goes (failure)."""

    def __init__(self, growing: _Growing) -> None:
        self.growing = growing
        self.file = os.fdopen(os.dup(growing.temp.read_fd), "rb")

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "_Tail":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ChunkReads:
    def __init__(self, *, settings: CacheSettings, store: Store, upstream: Upstream, cluster: ClusterView,
                 relay: PeerRelay, counts: Counts, metrics: Metrics, via: str,
                 send_file: Callable[..., Awaitable[None]], forget: Callable[[Meta, str], Awaitable[None]],
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.node_id = settings.identity
        self.store = store
        self.upstream = upstream
        self.cluster = cluster
        self.relay = relay
        self.counts = counts
        self.metrics = metrics
        self.via = via
        self.send_file = send_file  # Responder.send_file: sendfile from a stored file to a client
        self.forget = forget  # drop a manifest whose object changed at the origin
        self.spawn = spawn  # background work the node waits for (settled) and cancels (stop)
        self._clock = clock
        self._filling: dict[str, asyncio.Task] = {}
        self._growing: dict[str, _Growing] = {}  # chunks being written here, readable as they grow
        self._writing: dict[str, asyncio.Event] = {}  # set once a fill's chunk file starts growing
        self._fill_version: dict[str, Validator] = {}  # the version each running fill fetches
        # Tells every other node to drop one version's chunks of a key (set by
        # the request handler: cluster/invalidation.py `tell_old_chunks`).
        self.tell_old_chunks: Callable[..., Awaitable[None]] | None = None

    # -- a client's read -----------------------------------------------------------
    async def send(self, request: web.Request, resp: web.StreamResponse, meta: Meta, start: int,
                   length: int) -> None:
        """Write bytes [start, start + length) of the chunked object `meta` to `resp` (prepared), in order.

        Raises BrokenStream-like errors for the caller to break the connection
        on (the client must never see a short object as whole): ClientGone
        when the client went away, FillAborted / ChunkUnavailable when a chunk
        could not be had.
        """
        target = target_of(meta.key)
        validator = manifest_validator(meta)
        layout = Layout(size=meta.length, chunk_size=meta.chunk_size)
        owners = self.owners(meta.key, layout)
        pieces = collections.deque(layout.pieces(start, length))
        ahead: collections.deque[asyncio.Task] = collections.deque()

        def top_up() -> None:
            while pieces and len(ahead) < WINDOW:
                piece = pieces.popleft()
                ahead.append(asyncio.ensure_future(self._open(meta, target, layout, validator, piece,
                                                              owners[piece.index])))

        async def reopen(rest: Piece, broke: Peer | None, origin_only: bool) -> _Opened:
            if origin_only:
                return await self._from_origin(self._origin_url(target), layout, validator, rest, key=meta.key)
            others = [p for p in owners[rest.index] if broke is None or p.id != broke.id]
            return await self._open(meta, target, layout, validator, rest, others,
                                    owner=any(p.id == self.node_id for p in owners[rest.index]))

        try:
            top_up()
            while ahead:
                try:
                    opened = await ahead.popleft()
                    top_up()
                    await self._write(request, resp, opened, reopen=reopen)
                except ChunkChanged as e:
                    await self.forget(meta, str(e))
                    raise BrokenStream(str(e)) from e
                except NezhaError as e:
                    raise BrokenStream(f"{meta.key}: {e}") from e
        finally:
            for task in ahead:
                task.cancel()
            for result in await asyncio.gather(*ahead, return_exceptions=True):
                if isinstance(result, _Opened):
                    result.close()

    async def _write(self, request: web.Request, resp: web.StreamResponse, opened: _Opened, *,
                     reopen: Callable[[Piece, Peer | None, bool], Awaitable[_Opened]]) -> None:
        """Write `opened`'s piece to the client. A source that breaks off
        mid-piece (a peer killed, a connection reset) is marked down and the
        rest of the piece is asked again, of the chunk's other owners or
        the origin (`reopen`), at most RESUMES times: the client's body goes
        on where it was, never short."""
        piece = opened.piece
        sent = 0
        try:
            for attempt in range(RESUMES + 1):
                if opened.meta is not None:
                    try:
                        f = open(self.store.data_path(opened.meta), "rb")
                    except FileNotFoundError as e:
                        raise BrokenStream(f"chunk {opened.meta.key} vanished before it was read") from e
                    with f:
                        await self.send_file(request, resp, f, piece.offset + sent, piece.length - sent)
                    return
                if opened.growing is not None:
                    # This node is filling the chunk: its bytes go out as they land, not once it is whole.
                    sent += await self._send_tail(request, resp, opened.growing, piece.offset + sent,
                                                  piece.length - sent)
                    if sent == piece.length:
                        return
                    log.warning("chunk_source_broke", source=opened.source, index=piece.index, sent=sent,
                                reason=f"its fill here ended after {sent} of {piece.length} bytes",
                                resume=attempt < RESUMES)
                    opened.close()
                    if attempt == RESUMES:
                        raise BrokenStream(f"{opened.source} ended early, and no other source finished it")
                    # As when this node's fill fails before a byte is read: the rest from the origin, unstored.
                    opened = await reopen(Piece(index=piece.index, offset=piece.offset + sent,
                                                length=piece.length - sent), None, True)
                    continue
                answer = opened.response
                assert answer is not None

                def moved(n: int) -> None:
                    nonlocal sent
                    sent += n

                try:
                    if self.relay.splice and answer.content_length == piece.length - sent \
                            and splice.usable(answer, request):
                        # Socket to socket in the kernel, as a relay does: the bytes never enter Python.
                        await splice.splice_body(answer, request, resp, read_timeout=self.settings.origin_read_timeout,
                                                 on_bytes=moved)
                    else:
                        async for data in answer.content.iter_chunked(self.settings.read_size):
                            if sent + len(data) > piece.length:
                                raise BrokenStream(f"{opened.source} sent more than the {piece.length} bytes asked")
                            await resp.write(data)
                            moved(len(data))
                    if sent == piece.length:
                        return
                    why = f"ended after {sent} of {piece.length} bytes"
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    why = f"broke off after {sent} of {piece.length} bytes: {type(e).__name__}"
                log.warning("chunk_source_broke", source=opened.source, index=piece.index, sent=sent,
                            reason=why, resume=attempt < RESUMES)
                if opened.peer is not None:
                    self.relay.mark_down(opened.peer, f"chunk {piece.index} {why}")
                opened.close()
                if attempt == RESUMES:
                    raise BrokenStream(f"{opened.source} {why}, and no other source finished it")
                opened = await reopen(Piece(index=piece.index, offset=piece.offset + sent,
                                            length=piece.length - sent), opened.peer, False)
        finally:
            opened.close()

    def owners(self, key: str, layout: Layout) -> list[list[Peer]]:
        """The owners of every chunk of `key` under this node's ring (nezha/chunks.py `place`)."""
        snap = self.cluster.snapshot
        if not snap.nodes:
            return [[] for _ in range(layout.count)]
        table = place(snap.ring(), key, layout, self.cluster.replicas)
        return [[Peer(n, snap.nodes[n]) for n in ids] for ids in table]

    async def _open(self, meta: Meta, target: Target, layout: Layout, validator: Validator,
                    piece: Piece, owners: list[Peer], owner: bool | None = None) -> _Opened:
        """Ask for `piece`: of this node's disk when it holds the chunk, owner
        or not; else
        of the owners ahead of this node in ring order (all of them for a
        non-owner), so a chunk is filled from the origin by its first live
        owner only; else, as an owner, fill it here; else, with no owner
        answering, from the origin (not stored). `owner`: whether this node
        owns the chunk, when `owners` leaves out one that broke off."""
        ckey = chunk_key(meta.key, piece.index, layout.chunk_size)
        url = self._origin_url(target)
        mine = owner if owner is not None else not owners or any(p.id == self.node_id for p in owners)
        # Also a chunk this node owned before the ring changed (a scale-up): as a
        # whole object, a copy a node holds is served to the clients it answers.
        held = self.store.lookup(ckey)
        if held is not None and validator.mismatch(dict(held.headers)) is None:
            return _Opened(piece, meta=held, source=f"chunk {ckey} here")
        ahead = next((owners[:i] for i, p in enumerate(owners) if p.id == self.node_id), owners)
        spec = ChunkSpec(index=piece.index, chunk_size=layout.chunk_size, length=layout.size, validator=validator)
        for peer in self.relay.order(ahead):
            opened = await self._ask_owner(peer, target, spec, piece)
            if opened is not None:
                return opened
        if mine:
            try:
                here = await self._stored_or_growing(key=meta.key, url=url, target=target, layout=layout,
                                                     index=piece.index, validator=validator)
            except ChunkChanged:
                raise
            except FillAborted as e:  # the fill broke off: this read takes the piece from the origin itself
                log.warning("chunk_fill_failed", key=ckey, error=str(e))
                return await self._from_origin(url, layout, validator, piece, key=meta.key)
            if isinstance(here, _Tail):
                return _Opened(piece, growing=here, source=f"chunk {ckey} filling here")
            return _Opened(piece, meta=here, source=f"chunk {ckey} here")
        log.warning("chunk_owners_unreachable", key=ckey, owners=[p.id for p in owners])
        return await self._from_origin(url, layout, validator, piece, key=meta.key)

    async def _ask_owner(self, peer: Peer, target: Target, spec: ChunkSpec, piece: Piece) -> _Opened | None:
        """`peer`'s answer for `piece`; None when it cannot be used and the next source should be tried."""
        headers = {"Host": target.host, PEER_HEADER: self.node_id, SCHEME_HEADER: target.scheme,
                   CHUNK_HEADER: spec.header(),
                   "Range": f"bytes={piece.offset}-{piece.offset + piece.length - 1}",
                   **peer_auth(self.settings.cluster_token)}
        try:
            r = await self.relay.ask(peer, "GET", peer.url + target.path_qs, headers=headers)
        except OriginError as e:
            self.relay.mark_down(peer, str(e))
            return None
        source = f"peer {peer.id} (chunk {spec.index})"
        if r.status == 412:
            why = (await r.text())[:300].strip()
            r.release()
            raise ChunkChanged(f"{source}: {why}")
        if r.status >= 500 and ORIGIN_ERROR_HEADER in r.headers:
            why = r.headers[ORIGIN_ERROR_HEADER]
            r.release()
            raise ChunkUnavailable(f"{source}: the origin failed: {why}")
        if r.status not in (200, 206) or r.content_length != piece.length:
            log.warning("chunk_peer_refused", peer=peer.id, status=r.status, length=r.content_length,
                        wanted=piece.length)
            r.release()
            if r.status >= 500:
                self.relay.mark_down(peer, f"answered {r.status} for a chunk")
            return None
        return _Opened(piece, response=r, source=source, peer=peer)

    async def _from_origin(self, url: str, layout: Layout, validator: Validator, piece: Piece, *,
                           key: str) -> _Opened:
        """`piece` straight from the origin, not stored: every owner of its chunk is down."""
        first, _ = layout.span(piece.index)
        lo, hi = first + piece.offset, first + piece.offset + piece.length - 1
        r = await self.upstream.request("GET", url, headers={"Range": f"bytes={lo}-{hi}",
                                                             "If-Range": validator.if_range, "Via": self.via},
                                        what=f"origin {url}")
        why = partial_mismatch(r.status, r.headers, first=lo, last=hi, total=layout.size, validator=validator)
        if why is not None:
            r.release()
            raise ChunkChanged(f"origin {url} for bytes {lo}-{hi} of {key}: {why}")
        return _Opened(piece, response=r, source=f"origin {url}")

    def _origin_url(self, target: Target) -> str:
        origin = self.settings.origin_table.get(target.host)
        if origin is None:
            raise ChunkUnavailable(f"{target.host} is no longer a configured origin")
        return origin.upstream_for(target.scheme, target.host) + target.path_qs

    # -- a chunk's owner ----------------------------------------------------------------
    async def serve(self, request: web.Request, *, key: str, url: str, target: Target) -> web.StreamResponse:
        """A peer's request for one chunk (CHUNK_HEADER): the Range asked of
        it, from this node's disk, filled first if needed; HEAD only makes
        sure this node holds it (a replica's copy, `_push`)."""
        record = access(request)
        record.cache = "chunk"
        try:
            spec = ChunkSpec.parse(request.headers[CHUNK_HEADER])
        except ValueError as e:
            raise web.HTTPBadRequest(text=f"bad chunk request for {key}: {e}\n")
        layout = spec.layout
        size = layout.length_of(spec.index)
        asked = parse_range(request.headers.get("Range", ""), size)
        if asked is False:
            raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
        start, count = asked if asked else (0, size)
        try:
            if request.method == "GET":
                here = await self._stored_or_growing(key=key, url=url, target=target, layout=layout,
                                                     index=spec.index, validator=spec.validator, source=spec.source)
            else:  # HEAD: a replica's copy, answered once it is whole here
                here = await self.local_chunk(key=key, url=url, target=target, layout=layout, index=spec.index,
                                              validator=spec.validator, source=spec.source)
            if isinstance(here, _Tail):
                return await self._send_growing(request, here, start=start, count=count, size=size,
                                                ranged=bool(asked))
            stored = here
        except ChunkChanged as e:
            raise web.HTTPPreconditionFailed(text=f"{e}\n")
        except OriginError as e:
            raise origin_failure(e)
        except NezhaError as e:  # a copy or a fill that broke off: the asker tries the next source
            log.warning("chunk_unavailable", key=key, index=spec.index, error=str(e))
            raise web.HTTPServiceUnavailable(text=f"chunk {spec.index} of {key} could not be had here: {e}\n")
        try:
            f = open(self.store.data_path(stored), "rb")
        except FileNotFoundError:
            raise web.HTTPServiceUnavailable(text=f"chunk {stored.key} was evicted while asked for; ask again\n")
        with f:
            resp = self._chunk_answer(start=start, count=count, size=size, ranged=asked)
            await resp.prepare(request)
            if request.method == "GET":
                await self.send_file(request, resp, f, start, count)
            await resp.write_eof()
        record.bytes = count if request.method == "GET" else 0
        self.counts.accessed(stored.key)
        return resp

    def _chunk_answer(self, *, start: int, count: int, size: int, ranged: bool) -> ExactResponse:
        """The head of this node's answer with bytes [start, start + count) of
        a chunk `size` long, stored or still being written."""
        resp = ExactResponse(status=206 if ranged else 200)
        if ranged:
            resp.headers["Content-Range"] = f"bytes {start}-{start + count - 1}/{size}"
        resp.headers[SERVED_BY_HEADER] = self.node_id
        resp.content_length = count
        return resp

    async def _send_growing(self, request: web.Request, tail: _Tail, *, start: int, count: int, size: int,
                            ranged: bool) -> web.StreamResponse:
        """Bytes [start, start + count) of a chunk still being written here,
        sent as they land. If its fill fails first, the connection is cut:
        the asking node resumes from that byte elsewhere (`_write`)."""
        with tail:
            resp = self._chunk_answer(start=start, count=count, size=size, ranged=ranged)
            await resp.prepare(request)
            sent = await self._send_tail(request, resp, tail, start, count)
            access(request).bytes = sent
            if sent < count:
                log.warning("chunk_fill_broke", key=access(request).key, sent=sent, wanted=count)
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
        return resp

    async def _send_tail(self, request: web.Request, resp: web.StreamResponse, tail: _Tail, start: int,
                         count: int) -> int:
        """Write bytes [start, start + count) of a chunk being filled here to
        `resp` as the fill writes them (by sendfile from its temp file, as a
        joiner of a whole object's fill is sent its bytes); how many went:
        fewer than `count` when the fill ended first, having failed."""
        growing, sent = tail.growing, 0
        while sent < count:
            ready = min(growing.temp.written - (start + sent), count - sent)
            if ready <= 0:
                if growing.ended:
                    break  # the fill failed (or was cut) before these bytes
                growing.moved.clear()
                await growing.moved.wait()
                continue
            await self.send_file(request, resp, tail.file, start + sent, ready)
            sent += ready
        return sent

    async def local_chunk(self, *, key: str, url: str, target: Target, layout: Layout, index: int,
                          validator: Validator, source: Peer | None = None) -> Meta:
        """Chunk `index` of `key` from this node's store, filled first when it
        is missing or of another version; one fill per chunk however many
        ask at once."""
        meta = self.held(key, index, layout, validator)
        if meta is not None:
            return meta
        task = self._fill_task(key=key, url=url, target=target, layout=layout, index=index, validator=validator,
                               source=source)
        # A reader that goes away leaves the fill running for the others (and the next read).
        return await asyncio.shield(task)

    async def _stored_or_growing(self, *, key: str, url: str, target: Target, layout: Layout, index: int,
                                 validator: Validator, source: Peer | None = None) -> Meta | _Tail:
        """Chunk `index` of `key` as stored here; else, once this node's fill
        of it (started if none runs) writes its first byte, that fill to read
        as it grows, so a reader waits for bytes, not for the whole chunk.
        Raises what the fill raises when it fails before writing."""
        stored = self.held(key, index, layout, validator)
        if stored is not None:
            return stored
        task = self._fill_task(key=key, url=url, target=target, layout=layout, index=index, validator=validator,
                               source=source)
        ckey = chunk_key(key, index, layout.chunk_size)
        writing = self._writing.get(ckey)
        if writing is not None:
            waiter = asyncio.ensure_future(writing.wait())
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        growing = self._growing.get(ckey)
        if growing is not None and growing.validator == validator:
            return _Tail(growing)  # its descriptor taken now, before the fill can close its own
        # A reader that goes away leaves the fill running for the others (and the next read).
        return await asyncio.shield(task)

    def held(self, key: str, index: int, layout: Layout, validator: Validator) -> Meta | None:
        """Chunk `index` of `key` as stored here, if it is of the version `validator` names."""
        meta = self.store.lookup(chunk_key(key, index, layout.chunk_size))
        return meta if meta is not None and validator.mismatch(dict(meta.headers)) is None else None

    def _fill_task(self, *, key: str, url: str, target: Target, layout: Layout, index: int, validator: Validator,
                   source: Peer | None) -> asyncio.Task:
        """The fill of chunk `index` running here, started if none is."""
        ckey = chunk_key(key, index, layout.chunk_size)
        task = self._filling.get(ckey)
        if task is None:
            # The fill sets its own event, also once superseded and another fill of `ckey` runs.
            writing = self._writing[ckey] = asyncio.Event()
            task = self.spawn(self._fill(ckey, key=key, url=url, target=target, layout=layout, index=index,
                                         validator=validator, source=source, writing=writing))
            self._filling[ckey] = task
            self._fill_version[ckey] = validator

            def done(_: asyncio.Task) -> None:
                if self._filling.get(ckey) is task:  # not a fill started after this one was superseded
                    del self._filling[ckey]
                    self._writing.pop(ckey, None)
                    self._fill_version.pop(ckey, None)
            task.add_done_callback(done)
        return task

    async def drop_chunks(self, key: str) -> int:
        """Remove every chunk of the object `key` stored here, whatever its
        chunk size or version: the object was invalidated (a write, the
        invalidation broadcast, a chunk of another version), and its chunks
        would otherwise hold disk until LRU eviction. A chunk fill of it under
        way is let finish (a peer may be reading it as it grows) but what it
        commits is removed. How many chunks went."""
        for ckey, task in list(self._filling.items()):
            found = chunk_of(ckey)
            if found is not None and found[0] == key:
                self._supersede(ckey, task)
        removed = 0
        for ckey in self.store.chunks_of(key):
            for meta in await self.store.remove(ckey):
                self.counts.gone(meta)
                removed += 1
        if removed:
            log.info("chunks_invalidated", key=key, chunks=removed)
        return removed

    async def drop_version(self, key: str, chunk_size: int, validator: Validator) -> int:
        """Remove the chunks of `key` cut `chunk_size` long of the version
        `validator` names: the key's owner stored another version, so no
        manifest names these any more. Chunks of any other version or size
        stay (the new version's may be filling already). How many went."""
        for ckey, task in list(self._filling.items()):
            found = chunk_of(ckey)
            if found is not None and found[:2] == (key, chunk_size) and self._fill_version.get(ckey) == validator:
                self._supersede(ckey, task)
        removed = 0
        for ckey in self.store.chunks_of(key):
            found = chunk_of(ckey)
            meta = self.store.lookup(ckey)
            if found is None or found[1] != chunk_size or meta is None or validator.mismatch(dict(meta.headers)):
                continue
            if await self.store.remove_one(meta):
                self.counts.gone(meta)
                removed += 1
        if removed:
            log.info("old_chunks_removed", key=key, chunks=removed, chunk_size=chunk_size)
        return removed

    def replaced(self, old: Meta, new: Meta | None) -> None:
        """This node stored a new answer for the chunked object `old` from
        the origin (`new`: its manifest; None: stored whole). Unless it is the
        same version cut the same way, the old version's chunks are removed
        here and on every other node, in the background: nothing names them."""
        validator = manifest_validator(old)
        if new is not None and new.chunk_size == old.chunk_size and manifest_validator(new) == validator:
            return

        async def drop() -> None:
            await self.drop_version(old.key, old.chunk_size, validator)
            if self.tell_old_chunks is not None:
                await self.tell_old_chunks(old.key, chunk_size=old.chunk_size, validator=validator,
                                           why="a new version replaced it")
        self.spawn(drop())

    def _supersede(self, ckey: str, task: asyncio.Task) -> None:
        """The fill `task` of `ckey` fetches what nothing will name: let it
        finish for whoever reads it now, remove what it commits, and start
        the next read of `ckey` on a fill of its own."""
        del self._filling[ckey]
        self._writing.pop(ckey, None)  # its waiters keep the event, which the fill still sets
        self._fill_version.pop(ckey, None)
        task.add_done_callback(self._drop_late)

    def _drop_late(self, task: asyncio.Task) -> None:
        """A chunk fill superseded by its object's invalidation finished: remove what it committed."""
        if task.cancelled() or task.exception() is not None:
            return
        meta: Meta = task.result()

        async def drop() -> None:
            if await self.store.remove_one(meta):
                self.counts.gone(meta)
                log.info("chunk_dropped", key=meta.key, reason="its object was invalidated or replaced meanwhile")
        self.spawn(drop())

    async def _fill(self, ckey: str, *, key: str, url: str, target: Target, layout: Layout, index: int,
                    validator: Validator, writing: asyncio.Event, source: Peer | None = None) -> Meta:
        """Fill chunk `index` here: from a live owner ahead of this node in
        ring order when one holds it (a replica copies the first owner's
        chunk; one that breaks off is marked down and the next source tried),
        else from the origin, which makes this node the chunk's first live
        owner: it then asks the owners behind it to copy the chunk from it."""
        size = layout.length_of(index)
        started = time.monotonic()
        owners = self.owners(key, layout)[index]
        mine = next((i for i, p in enumerate(owners) if p.id == self.node_id), None)
        spec = ChunkSpec(index=index, chunk_size=layout.chunk_size, length=layout.size, validator=validator)
        ahead = [p for p in owners[:mine] if not self.relay.is_down(p)] if mine is not None else []
        if source is not None and source.id != self.node_id:
            ahead = [source] + [p for p in ahead if p.id != source.id]
        for peer in ahead:
            opened = await self._ask_owner(peer, target, spec, Piece(index=index, offset=0, length=size))
            if opened is None:
                continue
            assert opened.response is not None
            try:
                stored = await self._store_chunk(ckey, opened.response, source=opened.source, url=url,
                                                 host=target.host, size=size, length=layout.size,
                                                 validator=validator, origin=False, writing=writing)
            except FillAborted as e:
                self.relay.mark_down(peer, str(e))
                continue
            log.info("chunk_filled", key=ckey, bytes=size, source=peer.id,
                     seconds=round(time.monotonic() - started, 3))
            return stored
        first, last = layout.span(index)
        headers = {"Range": f"bytes={first}-{last}", "If-Range": validator.if_range, "Via": self.via}
        response = await self.upstream.request("GET", url, headers=headers, what=f"origin {url}")
        why = partial_mismatch(response.status, response.headers, first=first, last=last, total=layout.size,
                               validator=validator)
        if why is not None:
            response.release()
            log.warning("chunk_changed", key=ckey, url=url, reason=why)
            raise ChunkChanged(f"origin {url} for chunk {index} ({first}-{last}) {why}: the object "
                               f"changed since it was chunked; nothing stored")
        stored = await self._store_chunk(ckey, response, source=f"origin {url}", url=url, host=target.host,
                                         size=size, length=layout.size, validator=validator, origin=True,
                                         writing=writing)
        log.info("chunk_filled", key=ckey, bytes=size, source="origin", seconds=round(time.monotonic() - started, 3))
        if mine is not None:
            for behind in owners[mine + 1:]:
                self.spawn(self._push(behind, target, spec))  # its result is logged there
        return stored

    async def _store_chunk(self, ckey: str, response: aiohttp.ClientResponse, *, source: str, url: str, host: str,
                           size: int, length: int, validator: Validator, origin: bool,
                           writing: asyncio.Event) -> Meta:
        """Write `response`'s body, exactly `size` bytes, as chunk `ckey` and commit it; FillAborted
        (nothing stored) when it breaks off, runs short or long."""
        growing: _Growing | None = None
        try:
            async with self.store.writing(reserve=size) as write:
                temp = write.temp
                # Peers asking for the chunk meanwhile read it as it grows (`_send_growing`).
                growing = self._growing[ckey] = _Growing(temp=temp, validator=validator)
                writing.set()  # whoever waits for the fill's first byte (`_stored_or_growing`)
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
                now = self._clock()
                pairs = tuple((n, v) for n, v in (("ETag", validator.etag), ("Last-Modified", validator.last_modified))
                              if v is not None)
                # `length`: the whole object's, so a hand-off can place the chunk without the manifest.
                stored = await write.commit(Meta(key=ckey, url=url, host=host, size=0, headers=pairs, stored_at=now,
                                                 expires_at=now + CHUNK_LIFETIME, length=length))
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise FillAborted(f"{source} broke off {ckey}: {type(e).__name__}: {e}") from e
        finally:
            response.release()
            if growing is not None:
                growing.ended = True
                growing.moved.set()
                if self._growing.get(ckey) is growing:
                    del self._growing[ckey]
                close_reader(growing.temp)  # readers hold duplicates of their own
        self.counts.stored(stored)
        return stored

    async def hand_off(self, meta: Meta, view: ClusterView) -> list[str]:
        """This node is leaving the ring: have the owners of chunk `meta`
        under `view`'s ring copy it from here (a HEAD chunk request naming
        this node as its source). One result a new owner (ReplicateResult)."""
        found = chunk_of(meta.key)
        if found is None or meta.length <= 0:
            return [replicate_failed(f"{meta.key} is no chunk this node can place")]
        key, chunk_size, index = found
        layout = Layout(size=meta.length, chunk_size=chunk_size)
        snap = view.snapshot
        if not snap.nodes or index >= layout.count:
            return [replicate_failed(f"no owner for {meta.key}")]
        owners = [Peer(n, snap.nodes[n]) for n in place(snap.ring(), key, layout, view.replicas)[index]]
        me = Peer(self.node_id, self.settings.advertise or self.settings.listen)
        etag, last_modified = meta.etag, meta.last_modified
        spec = ChunkSpec(index=index, chunk_size=chunk_size, length=layout.size, source=me,
                         validator=Validator(etag=etag, last_modified=None if etag else last_modified))
        return [await self._push(peer, target_of(key), spec) for peer in owners if peer.id != self.node_id]

    async def _push(self, peer: Peer, target: Target, spec: ChunkSpec) -> str:
        """Have `peer`, an owner of the chunk behind this node, hold it too:
        a HEAD chunk request, which it answers once it has copied the chunk
        (from this node, the owner ahead of it). A failure only logs: the
        chunk stays on this node, and `peer` fills it at its next read."""
        headers = {"Host": target.host, PEER_HEADER: self.node_id, SCHEME_HEADER: target.scheme,
                   CHUNK_HEADER: spec.header(), **peer_auth(self.settings.cluster_token)}
        try:
            r = await self.relay.ask(peer, "HEAD", peer.url + target.path_qs, headers=headers)
        except OriginError as e:
            log.warning("chunk_replica_failed", peer=peer.id, index=spec.index, error=str(e))
            return replicate_failed(e)
        r.release()
        if r.status != 200:
            log.warning("chunk_replica_failed", peer=peer.id, index=spec.index, status=r.status)
            return replicate_failed(f"{peer.id} answered {r.status}")
        return ReplicateResult.COPIED
