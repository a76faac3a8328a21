"""A chunked object read for a client: its bytes as a body source.

The node answering the client, whichever it is, writes the bytes the client
asked for in order, chunk by chunk (`ChunkReads.send`). Each needed chunk is
asked of its owners `WINDOW` chunks ahead of the one being written, so cold
chunks fill on their owners in parallel while the client reads. A peer's
bytes go socket to socket by splice where the transports allow, else in
`read_size` pieces; a chunk this node holds goes out by sendfile: nothing
holds a chunk in memory. A read of the whole object whose origin published
a digest of it goes through Python instead, hashed in order, its last byte
held until the hash matches (chunks/whole.py). A source that breaks off mid-chunk is resumed from
the same byte elsewhere (`_write`). A whole chunk this node does not own is
asked of its owners once however many clients read it here at once: they
share one flight (chunks/fills.py `ChunkFills.passing`), reading its temp
file as it grows, so an owner sends each chunk once per node in a stampede,
not once per client.

When no owner of a chunk answers, the reading node takes the chunk's bytes
from the origin itself under the manifest's validator (not stored): a job
never fails because a cache node did. A chunk that comes back as another
version is `ChunkChanged`: the client's response is broken (never a mix of
two versions) and the manifest is forgotten everywhere, so the next request
starts again from the origin's current answer.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

import aiohttp
import structlog
from aiohttp import web

from cachenode.chunks.fills import ChunkFills
from cachenode.chunks.kept import KeptChunks, Reading
from cachenode.chunks.peers import ChunkPeers, Members, Relay, owners_of
from cachenode.chunks.peers_first import Paced
from cachenode.chunks.sources import Opened, SendFile, Tail, send_held, send_tail
from cachenode.chunks.spec import ChunkChanged, ChunkSpec, ChunkUnavailable, manifest_validator
from cachenode.chunks.whole import CheckedBody, whole_digest
from cachenode.counts import Counts
from cachenode.fill.parallel import Validator, partial_mismatch
from cachenode.fill.upstream import Upstream
from cachenode.http.digests import Mismatch
from cachenode.kernel import splice
from cachenode.kernel.splice import BrokenStream
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.chunks import Layout, Piece, chunk_key
from nezha.config import CacheSettings
from nezha.errors import FillAborted, NezhaError
from nezha.keys import Target, target_of
from nezha.ring import Peer

if TYPE_CHECKING:
    from prometheus_client import Counter

log = structlog.get_logger("nezha.chunks")

# Chunks asked of their owners ahead of the one being written to the client:
# enough to keep several owners filling (or sending) at once, few enough that
# a client that stops reading holds only this many open answers. In a stampede
# a later chunk reaches the other nodes through a chain whose first hop leaves
# its owner beside that owner's clients' long-running reads, and on a link they
# fill such a new stream gets a small share (0.3-0.4 MB/s of 10 in the traced
# runs): every node down the chain then waited for it when its clients got
# there. Asked 6 ahead rather than 4, chunks 5 and 6 of the first reads start
# with the wave, not a second into it (docs/benchmarks.md, "Chunk stampedes:
# the chains' first hops", 2026-11-28).
WINDOW = 6
# Times the rest of one piece is asked again after its source broke off mid-piece.
RESUMES = 3


class DropChunks(Protocol):
    """How one version's chunks of an object are removed on every node (chunks/copies.py `ChunkCopies`)."""

    async def drop_everywhere(self, key: str, chunk_size: int, validator: Validator, *, why: str) -> None: ...


class Forget(Protocol):
    """How an object whose chunks changed at the origin is forgotten here and
    at every node that may hold it (cachenode/cluster/invalidation.py `Invalidation.everywhere`)."""

    async def everywhere(self, keys: list[str], *, why: str) -> None: ...


def origin_url(settings: CacheSettings, target: Target) -> str:
    """The origin URL of `target`; ChunkUnavailable when its host is no longer a configured origin."""
    origin = settings.origin_table.get(target.host)
    if origin is None:
        raise ChunkUnavailable(f"{target.host} is no longer a configured origin")
    return origin.url_of(target)


class ChunkReads:
    def __init__(self, *, settings: CacheSettings, store: Store, upstream: Upstream, members: Members,
                 fills: ChunkFills, kept: KeptChunks, peers: ChunkPeers, relay: Relay, via: str,
                 send_file: SendFile, forget: Forget, counts: Counts, drop: DropChunks | None = None,
                 mismatches: "Counter | None" = None) -> None:
        self.settings = settings
        self.node_id = settings.identity
        self.store = store
        self.upstream = upstream
        self.members = members
        self.fills = fills
        self.kept = kept  # adopted chunks 0 this node owns none of (chunks/adopted.py)
        self.peers = peers
        self.relay = relay
        self.via = via
        self.send_file = send_file  # sendfile from a stored file to a client
        self.forget = forget  # drop a manifest whose object changed at the origin
        self.counts = counts  # a piece read from the origin past every owner: bytes from origin, not stored
        self.drop = drop  # a whole read that failed the origin's digest: its chunks go everywhere
        self.mismatches = mismatches  # nezha_digest_mismatches_total{origin}

    async def send(self, request: web.Request, resp: web.StreamResponse, meta: Meta, start: int,
                   length: int) -> None:
        """Write bytes [start, start + length) of the chunked object `meta` to `resp` (prepared), in order.

        Raises BrokenStream-like errors for the caller to break the connection
        on (the client must never see a short object as whole): ClientGone
        when the client went away, BrokenStream when a chunk could not be had.
        """
        manifest = meta.manifest
        assert manifest is not None, f"{meta.key} is no chunked object"
        target, validator, layout = target_of(meta.key), manifest_validator(meta), manifest.layout
        owners = owners_of(self.members, meta.key, layout)
        pieces = collections.deque(layout.pieces(start, length))
        ahead: collections.deque[asyncio.Task] = collections.deque()
        # A read of the whole object is checked against the origin's digest of it (chunks/whole.py).
        expected = whole_digest(meta, start, length) if request.method == "GET" else None
        checked = CheckedBody(resp, expected, length=length) if expected is not None else None
        out = checked if checked is not None else resp
        send_file = checked.send_file if checked is not None else self.send_file
        # A copy of chunk 0 this node adopted but owns none of stays until this read passed it (chunks/kept.py).
        first = (self.kept.reading(chunk_key(meta.key, 0, layout.chunk_size)) if start < layout.length_of(0)
                 else Reading(None))

        def top_up() -> None:
            while pieces and len(ahead) < WINDOW:
                piece = pieces.popleft()
                ahead.append(asyncio.ensure_future(self._open(meta, target, layout, validator, piece,
                                                              owners[piece.index])))

        reopen = functools.partial(self._reopen, meta, target, layout, validator, owners)
        broke_off = functools.partial(self._broke_off, target, layout, validator)
        paced = functools.partial(self._client, meta.key, layout.chunk_size)  # behind peers here: peers_first.py

        try:
            top_up()
            while ahead:
                try:
                    opened = await ahead.popleft()
                    top_up()
                    await self._write(request, out, opened, host=meta.host, reopen=reopen, send_file=send_file,
                                      broke_off=broke_off, paced=paced)
                    first.done()  # chunk 0 is written first, if at all
                except ChunkChanged as e:
                    await self.forget.everywhere([meta.key], why=str(e))
                    raise BrokenStream(str(e)) from e
                except NezhaError as e:
                    raise BrokenStream(f"{meta.key}: {e}") from e
            if checked is not None:
                mismatch = await checked.finish()
                if mismatch is not None:
                    await self._mismatched(meta, layout, validator, mismatch)
                    raise BrokenStream(f"{meta.key}: its chunks are not what the origin published: {mismatch}")
        finally:
            first.done()
            for task in ahead:
                task.cancel()
            for result in await asyncio.gather(*ahead, return_exceptions=True):
                if isinstance(result, Opened):
                    result.close()

    async def _reopen(self, meta: Meta, target: Target, layout: Layout, validator: Validator,
                      owners: list[list[Peer]], rest: Piece, broke: Peer | None, origin_only: bool) -> Opened:
        """The rest of a piece whose source broke off (`_write`'s `reopen`), asked
        again of the chunk's other owners, or of this node's fill or the origin."""
        # This node's fill of the chunk still runs (its source broke off, it goes on from the next):
        # the rest from it, as for every reader joined to it, not one origin request per reader.
        # Its fill here may have ended by the time this reader came to the rest (its window opened
        # the first source's file long before): the rest from the chunk it stored, not the origin.
        if origin_only and not self.fills.running(meta.key, rest.index, layout):
            held = self.fills.held(meta.key, rest.index, layout, validator)
            if held is not None:
                return Opened(rest, meta=held, source=f"chunk {held.key} here")
            return await self._from_origin(origin_url(self.settings, target), layout, validator, rest,
                                           key=meta.key)
        others = [p for p in owners[rest.index] if broke is None or p.id != broke.id]
        return await self._open(meta, target, layout, validator, rest, others,
                                owner=any(p.id == self.node_id for p in owners[rest.index]))

    async def _mismatched(self, meta: Meta, layout: Layout, validator: Validator, mismatch: Mismatch) -> None:
        """A whole read's bytes failed the origin's digest: logged and counted
        as a fill's mismatch, and the object's chunks and manifest forgotten
        on every node, so the next read fetches it again."""
        log.error("digest_mismatch", origin=meta.host, key=meta.key, source="chunks", field=mismatch.expected.field,
                  expected=mismatch.expected.shown(), got=mismatch.got, bytes=mismatch.length)
        if self.mismatches is not None:
            self.mismatches.labels(origin=meta.host).inc()
        why = f"its chunks failed {mismatch.expected.field}"
        if self.drop is not None:
            await self.drop.drop_everywhere(meta.key, layout.chunk_size, validator, why=why)
        await self.forget.everywhere([meta.key], why=why)

    async def _write(self, request: web.Request, resp: web.StreamResponse | CheckedBody, opened: Opened, *,
                     host: str, reopen: Callable[[Piece, Peer | None, bool], Awaitable[Opened]],
                     send_file: SendFile, broke_off: Callable[[Peer, int, str], Awaitable[None]],
                     paced: Callable[[Piece], Paced]) -> None:
        """Write `opened`'s piece to the client. A source that breaks off
        mid-piece (a peer killed, a connection reset) is marked down (unless
        its own fill failed: `broke_off`; a chunk passed on here was judged
        by the fill that passed it, chunks/fills.py `_fill`) and the
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
                    with f, paced(piece) as pace:
                        await send_held(send_file, request, resp, f, piece.offset + sent, piece.length - sent, pace)
                    return
                if opened.growing is not None:
                    # This node is filling the chunk: its bytes go out as they land, not once it is whole.
                    with paced(piece) as pace:
                        sent += await send_tail(send_file, request, resp, opened.growing, piece.offset + sent,
                                                piece.length - sent, pace)
                    if sent == piece.length:
                        return
                    why = f"its fill here ended after {sent} of {piece.length} bytes"
                    gave_up = f"{opened.source} ended early, and no other source finished it"
                    # As when this node's fill fails before a byte is read: the rest from the origin, unstored;
                    # a chunk passed on from an owner that broke off: the rest from the others, asked by this
                    # read alone, as when this read's own answer from it breaks off.
                    broke = opened.growing.growing.peer if opened.passed else None
                    origin_only = not opened.passed
                else:
                    sent, why = await self._relay(request, resp, opened, piece, sent=sent, host=host)
                    if why is None:
                        return
                    gave_up = f"{opened.source} {why}, and no other source finished it"
                    broke, origin_only = opened.peer, False
                log.warning("chunk_source_broke", source=opened.source, index=piece.index, sent=sent,
                            reason=why, resume=attempt < RESUMES)
                if broke is not None and not opened.passed:
                    await broke_off(broke, piece.index, f"chunk {piece.index} {why}")
                opened.close()
                if attempt == RESUMES:
                    raise BrokenStream(gave_up)
                opened = await reopen(Piece(index=piece.index, offset=piece.offset + sent,
                                            length=piece.length - sent), broke, origin_only)
        finally:
            opened.close()

    def _client(self, key: str, chunk_size: int, piece: Piece) -> Paced:
        """A client's sender of `piece` of `key`'s chunks, kept behind the peers reading them here."""
        return self.fills.peers_first.sender(key, base=piece.index * chunk_size, at=piece.offset, peer=False)

    async def _broke_off(self, target: Target, layout: Layout, validator: Validator, peer: Peer, index: int,
                         why: str) -> None:
        """`peer`'s answer for chunk `index` broke off: marked down unless its
        own fill failed (`ChunkPeers.broke_off`)."""
        spec = ChunkSpec(index=index, chunk_size=layout.chunk_size, length=layout.size, validator=validator)
        await self.peers.broke_off(peer, target, spec, why)

    async def _relay(self, request: web.Request, resp: web.StreamResponse | CheckedBody, opened: Opened,
                     piece: Piece, *, sent: int, host: str) -> tuple[int, str | None]:
        """Pass the answer `opened` holds on to the client, from byte `sent` of
        `piece`: how far the piece got, and why it stopped short (None: it did not)."""
        answer = opened.response
        assert answer is not None

        def moved(n: int) -> None:
            nonlocal sent
            sent += n

        before = sent
        try:
            if self.relay.splice and answer.content_length == piece.length - sent \
                    and not isinstance(resp, CheckedBody) and splice.usable(answer, request):
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
                return sent, None
            why = f"ended after {sent} of {piece.length} bytes"
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            why = f"broke off after {sent} of {piece.length} bytes: {type(e).__name__}"
        finally:
            if opened.peer is None and sent > before:  # the origin's answer, not a peer's
                self.counts.count(host, bytes_from_origin=sent - before)
        return sent, why

    async def _open(self, meta: Meta, target: Target, layout: Layout, validator: Validator,
                    piece: Piece, owners: list[Peer], owner: bool | None = None) -> Opened:
        """Ask for `piece`: of this node's disk when it holds the chunk, owner
        or not; else, for a whole chunk, of this node's one flight for it (a
        non-owner's passed on from the owners, an owner's fill, which copies
        from the owners ahead of it first); else of the owners ahead of this
        node in ring order (all of them for a non-owner), so a chunk is
        filled from the origin by its first live owner only; else, as an
        owner, fill it here; else, with no owner answering, from the origin
        (not stored). `owner`: whether this node owns the chunk, when
        `owners` leaves out one that broke off."""
        ckey = chunk_key(meta.key, piece.index, layout.chunk_size)
        url = origin_url(self.settings, target)
        mine = owner if owner is not None else not owners or any(p.id == self.node_id for p in owners)
        # Also a chunk this node owned before the ring changed (a scale-up): as a
        # whole object, a copy a node holds is served to the clients it answers.
        held = self.store.lookup(ckey)
        if held is not None and validator.mismatch(dict(held.headers)) is None:
            return Opened(piece, meta=held, source=f"chunk {ckey} here")
        ahead = next((owners[:i] for i, p in enumerate(owners) if p.id == self.node_id), owners)
        whole = piece.offset == 0 and piece.length == layout.length_of(piece.index)
        if not mine and whole:
            # A whole chunk this node does not own: one request to its owners for
            # every client reading it here meanwhile (`ChunkFills.passing`).
            try:
                tail = await self.fills.passing(key=meta.key, url=url, target=target, layout=layout,
                                                index=piece.index, validator=validator)
            except ChunkChanged:
                raise
            except NezhaError as e:  # no owner answered the shared request: this read asks on its own
                held = self.store.lookup(ckey)
                if held is not None and validator.mismatch(dict(held.headers)) is None:
                    # The fill it joined was this node's first answer (chunks/adopted.py `AdoptedChunks.adopt`), and it ended
                    # stored as this reader came: from here, not one more copy across a link.
                    return Opened(piece, meta=held, source=f"chunk {ckey} here")
                log.info("chunk_pass_missed", key=ckey, reason=str(e))
            else:
                return Opened(piece, growing=tail, passed=True, source=f"chunk {ckey} passed on here")
        spec = ChunkSpec(index=piece.index, chunk_size=layout.chunk_size, length=layout.size, validator=validator)
        # A whole chunk this node owns behind others (a replica), or any piece of one it is filling, is
        # its fill's, which copies it from the owners ahead as it grows: one request for all its clients.
        joined = mine and (whole or self.fills.running(meta.key, piece.index, layout))
        for peer in [] if joined else self.relay.order(ahead):
            opened = await self.peers.ask(peer, target, spec, piece)
            if isinstance(opened, Opened):  # a reader's own request is never sent on (no role)
                return opened
        if mine:
            try:
                here = await self.fills.stored_or_growing(key=meta.key, url=url, target=target, layout=layout,
                                                          index=piece.index, validator=validator)
            except ChunkChanged:
                raise
            except FillAborted as e:  # the fill broke off: this read takes the piece from the origin itself
                log.warning("chunk_fill_failed", key=ckey, error=str(e))
                return await self._from_origin(url, layout, validator, piece, key=meta.key)
            if isinstance(here, Tail):
                return Opened(piece, growing=here, source=f"chunk {ckey} filling here")
            return Opened(piece, meta=here, source=f"chunk {ckey} here")
        log.warning("chunk_owners_unreachable", key=ckey, owners=[p.id for p in owners])
        return await self._from_origin(url, layout, validator, piece, key=meta.key)

    async def _from_origin(self, url: str, layout: Layout, validator: Validator, piece: Piece, *,
                           key: str) -> Opened:
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
        return Opened(piece, response=r, source=f"origin {url}")
