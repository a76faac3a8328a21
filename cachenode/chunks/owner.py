"""The owner's side of a chunk: answering a peer's request for one chunk.

A peer reading a chunked object asks the chunk's owner for a Range inside
one chunk (CHUNK_HEADER names the chunk and its version). The owner sends it
from its disk, filling it first when it is missing (`ChunkFills`): a fill in
progress is sent as it lands, so the asker waits for bytes, not for the whole
chunk. HEAD only makes sure this node holds the chunk (a replica's copy,
`ChunkPeers.push`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import IO, Callable, Iterator, Protocol

import structlog
from aiohttp import web

from cachenode.chunks.feeders import FEEDS, Feeders, fanout_for, star
from cachenode.chunks.fills import ChunkFills
from cachenode.chunks.peers import Members
from cachenode.chunks.peers_first import Paced, unhurried
from cachenode.chunks.sources import SendFile, Tail, send_held, send_tail
from cachenode.chunks.spec import ChunkChanged, ChunkSpec
from cachenode.counts import Counts
from cachenode.http.conditionals import parse_range
from cachenode.kernel.splice import ClientGone
from cachenode.peers.cuts import Cuts, answer_cut
from cachenode.store.blocks import summary
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.chunks import chunk_key, chunk_of
from nezha.errors import NezhaError, OriginError
from nezha.keys import Target
from nezha.wire import (BLOCKS_HEADER, CHUNK_FEEDER_HEADER, CHUNK_HEADER, CUT_HEADER, FILL_FAILED_HEADER, PEER_HEADER,
                        SERVED_BY_HEADER, origin_error_value)

log = structlog.get_logger("nezha.chunks")


class Record(Protocol):
    """The request's record behind its request_completed line (cachenode/front/access.py `Access`)."""

    key: str | None
    cache: str | None
    bytes: int


class Counted:
    """The send_file of one answer to a peer, counting the bytes that left:
    what a reader that went away mid-answer was sent (`ChunkOwner.serve`)."""

    def __init__(self, send_file: SendFile) -> None:
        self._send_file = send_file
        self.sent = 0
        self.resp: web.StreamResponse | None = None  # the answer, once prepared

    async def __call__(self, request: web.Request, resp: web.StreamResponse, f: IO[bytes], offset: int,
                       count: int) -> None:
        try:
            await self._send_file(request, resp, f, offset, count)
        except ClientGone as e:
            self.sent += e.sent
            raise
        self.sent += count


class ChunkOwner:
    def __init__(self, *, node_id: str, store: Store, fills: ChunkFills, members: Members, counts: Counts,
                 send_file: SendFile, clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.members = members  # the ring: how a node of a chunk's wave is reached
        self.feeders = Feeders()
        self.store = store
        self.fills = fills
        self.counts = counts
        self.send_file = send_file  # sendfile from a stored file to the asking peer
        self.cuts = Cuts(clock)  # the chunk answers it cut for a failed fill, for the peers that ask why

    async def serve(self, request: web.Request, record: Record, *, key: str, url: str,
                    target: Target) -> web.StreamResponse:
        """A peer's request for one chunk (CHUNK_HEADER): the Range asked of
        it, from this node's disk, filled first if needed; HEAD only makes
        sure this node holds it. An origin that failed the fill passes on as
        OriginError, for the caller to answer as any origin failure."""
        record.cache = "chunk"
        try:
            spec = ChunkSpec.parse(request.headers[CHUNK_HEADER])
        except ValueError as e:
            raise web.HTTPBadRequest(text=f"bad chunk request for {key}: {e}\n")
        layout = spec.layout
        size = layout.length_of(spec.index)
        if CUT_HEADER in request.headers:  # a peer asks why this node cut its answer (cachenode/peers/cuts.py)
            return answer_cut(self.cuts, chunk_key(key, spec.index, layout.chunk_size))
        asked = parse_range(request.headers.get("Range", ""), size)
        if asked is False:
            raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
        start, count = asked if asked else (0, size)
        ckey, asker = chunk_key(key, spec.index, layout.chunk_size), request.headers.get(PEER_HEADER)
        # A node reading the whole chunk in one flight: a node of this chunk's wave here (chunks/feeders.py).
        feeds = request.method == "GET" and spec.role in FEEDS and asker is not None and (start, count) == (0, size)
        if feeds and spec.role == "pass":
            sent_on = self._sent_on(ckey, asker, spec.index, chunks=layout.count)
            if sent_on is not None:
                return sent_on
        if feeds:
            self.feeders.sending(ckey, asker)
        counted = Counted(self.send_file)
        try:
            return await self._send(request, record, key=key, url=url, target=target, spec=spec, start=start,
                                    count=count, ranged=bool(asked), ckey=ckey, send_file=counted)
        except ConnectionError as e:  # ClientGone, or the answer's end written to a socket that went
            if counted.resp is None:
                raise
            # The reader went away mid-answer (a killed node, a pass that gave up): its own business,
            # not this node's failure, so one line and the answer as it went, no 500 and no traceback.
            record.bytes = counted.sent
            self._sent(request, target.host, counted.sent)
            log.info("chunk_reader_gone", key=ckey, chunk=spec.index, asker=asker, bytes=counted.sent,
                     wanted=count, error=str(e))
            return counted.resp
        finally:
            if feeds:
                self.feeders.sent(ckey)

    async def _send(self, request: web.Request, record: Record, *, key: str, url: str, target: Target,
                    spec: ChunkSpec, start: int, count: int, ranged: bool, ckey: str,
                    send_file: Counted) -> web.StreamResponse:
        """Bytes [start, start + count) of the chunk `spec` names, as stored here or as it grows."""
        size = spec.layout.length_of(spec.index)
        try:
            here = await self._here(request, key=key, url=url, target=target, spec=spec)
            if here is None:  # asked as a node of a wave ("fed") that has no flight of the chunk any more
                return web.Response(status=404, text=f"no flight of {ckey} here to feed from\n")
            if isinstance(here, Tail):
                return await self._send_growing(request, record, here, host=target.host, start=start,
                                                count=count, size=size, ranged=ranged, ckey=ckey,
                                                copy=spec.role == "fill", send_file=send_file)
        except ChunkChanged as e:
            raise web.HTTPPreconditionFailed(text=f"{e}\n")
        except OriginError:
            raise
        except NezhaError as e:  # a copy or a fill that broke off: the asker tries the next source
            log.warning("chunk_unavailable", key=key, index=spec.index, error=str(e))
            raise web.HTTPServiceUnavailable(text=f"chunk {spec.index} of {key} could not be had here: {e}\n",
                                             headers={FILL_FAILED_HEADER: origin_error_value(str(e))})
        return await self._send_stored(request, record, here, host=target.host, start=start, count=count,
                                       size=size, ranged=ranged, send_file=send_file)

    async def _here(self, request: web.Request, *, key: str, url: str, target: Target,
                    spec: ChunkSpec) -> Meta | Tail | None:
        """The chunk a peer asked for, as stored here or as this node's flight writes it: filled first
        if need be (HEAD: once whole here, a replica's copy); for a node of its wave ("fed"), from a
        flight here or nothing (None)."""
        layout, validator = spec.layout, spec.validator
        if spec.role == "fed":
            return await self.fills.feeding(key=key, layout=layout, index=spec.index, validator=validator)
        if request.method == "GET":
            return await self.fills.stored_or_growing(key=key, url=url, target=target, layout=layout,
                                                      index=spec.index, validator=validator, source=spec.source)
        return await self.fills.local(key=key, url=url, target=target, layout=layout, index=spec.index,
                                      validator=validator, source=spec.source)

    def _sent_on(self, ckey: str, asker: str, index: int, *, chunks: int) -> web.Response | None:
        """A 421 sending `asker`, which passes chunk `ckey` (of an object of `chunks`) on, to the node of the
        chunk's wave here it reads it from (chunks/feeders.py); None: this node answers it, as it answers
        every asker where the object's leads are even (`star`)."""
        nodes = len(self.members.snapshot.nodes)
        if star(chunks, nodes):
            return None
        feeder = self.feeders.feeder_for(ckey, asker, fanout=fanout_for(nodes))
        address = self.members.snapshot.nodes.get(feeder) if feeder is not None else None
        if feeder is None or address is None:
            return None
        log.info("chunk_sent_on", key=ckey, index=index, asker=asker, feeder=feeder)
        return web.Response(status=421, headers={CHUNK_FEEDER_HEADER: f"{feeder} {address}"},
                            text=f"read {ckey} from {feeder}, which reads it now\n")

    async def _send_stored(self, request: web.Request, record: Record, stored: Meta, *, host: str, start: int,
                           count: int, size: int, ranged: bool, send_file: Counted) -> web.StreamResponse:
        """Bytes [start, start + count) of the chunk `stored` here, by sendfile (none for HEAD), its
        blocks checked first when reads are verified."""
        try:
            f = open(self.store.data_path(stored), "rb")
        except FileNotFoundError:
            raise web.HTTPServiceUnavailable(text=f"chunk {stored.key} was evicted while asked for; ask again\n")
        with f:
            if self.store.verify_reads and stored.blocks and request.method == "GET":
                why = await asyncio.get_running_loop().run_in_executor(
                    None, self.store.verify, stored, f.fileno(), start, count)
                if why is not None:  # never copied to a peer: removed, and the asker tries the next source
                    self.store.damaged(stored, found_by="read", why=why)
                    raise web.HTTPServiceUnavailable(text=f"chunk {stored.key} was corrupt here and is removed; "
                                                          f"ask again\n")
            resp = self._answer(start=start, count=count, size=size, ranged=ranged)
            if stored.blocks and start == 0 and count == size:  # a whole copy: checked by the receiver
                resp.headers[BLOCKS_HEADER] = summary(stored.blocks)
            await resp.prepare(request)
            send_file.resp = resp
            if request.method == "GET":
                with self._paced(request, stored.key, start) as paced:
                    await send_held(send_file, request, resp, f, start, count, paced)
            await resp.write_eof()
        record.bytes = count if request.method == "GET" else 0
        self._sent(request, host, record.bytes)
        self.counts.accessed(stored.key)
        return resp

    @contextlib.contextmanager
    def _paced(self, request: web.Request, ckey: str, start: int) -> Iterator[Paced]:
        """This answer to a peer as a sender its object's clients here keep behind (chunks/peers_first.py),
        its socket keeping little unsent meanwhile."""
        found = chunk_of(ckey)
        assert found is not None, f"{ckey} is no chunk key"
        key, chunk_size, index = found
        unhurried(request.transport)
        try:
            with self.fills.peers_first.sender(key, base=index * chunk_size, at=start, peer=True) as paced:
                yield paced
        finally:
            unhurried(request.transport, unsent=0)

    def _answer(self, *, start: int, count: int, size: int, ranged: bool) -> web.StreamResponse:
        """The head of this node's answer with bytes [start, start + count) of
        a chunk `size` long, stored or still being written. No origin field is
        in it, so aiohttp's own head serializer writes it."""
        resp = web.StreamResponse(status=206 if ranged else 200)
        if ranged:
            resp.headers["Content-Range"] = f"bytes {start}-{start + count - 1}/{size}"
        resp.headers[SERVED_BY_HEADER] = self.node_id
        resp.content_length = count
        return resp

    def _sent(self, request: web.Request, host: str, sent: int) -> None:
        """Count the chunk bytes sent to the asking peer: this node's bytes served
        (nezha_bytes_served_total: to clients or peers), never a request or a hit,
        and not in the index's `bytes_served`, which the node the client reached
        counts (cachenode/counts.py drops it from a peer's request)."""
        self.counts.count(host, request=request, bytes_served=sent)

    async def _send_growing(self, request: web.Request, record: Record, tail: Tail, *, host: str, start: int,
                            count: int, size: int, ranged: bool, ckey: str, copy: bool,
                            send_file: Counted) -> web.StreamResponse:
        """Bytes [start, start + count) of a chunk still being written here,
        sent as they land; `copy`: to an owner behind this one, copying the
        chunk, whose place the fill keeps within a window of (chunks/landing.py). If its fill fails first, the cut is noted (`Cuts`)
        and the connection is cut: the asking node resumes from that byte
        elsewhere (cachenode/chunks/reads.py `_write`, chunks/fills.py `_fill`)."""
        with tail:
            resp = self._answer(start=start, count=count, size=size, ranged=ranged)
            await resp.prepare(request)
            send_file.resp = resp
            with self._paced(request, ckey, start) as paced, \
                    Paced(tail.growing.pace, peer=copy, offset=start, replica=True) as behind:
                sent = await send_tail(send_file, request, resp, tail, start, count, paced,
                                       copy=behind if copy else None)
            record.bytes = sent
            self._sent(request, host, sent)
            if sent < count:
                log.warning("chunk_fill_broke", key=record.key, sent=sent, wanted=count)
                self.cuts.note(ckey, f"its fill ended after {tail.growing.temp.written} of {size} bytes")
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
        return resp
