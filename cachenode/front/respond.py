"""Writing responses: stored objects by sendfile, growing fills, pass-through copies.

Every writer streams: a stored object goes out by os.sendfile
(`kernel/sendfile.py`), a fill is sent from its temp file as bytes land, a pass-through is copied chunk by
chunk. None holds a whole object in memory. When a body cannot be finished
the connection is aborted, so the client sees an error, never a short object.

A client that hangs up mid-body is an ordinary outcome, not an error: one
`client_gone` line with the bytes that left, those bytes counted, and the
fill and every other client carry on.
"""

from __future__ import annotations

import asyncio
import time
from typing import IO, Awaitable, Callable, Protocol

import aiohttp
import structlog
from aiohttp import web

from cachenode.front import copies_first
from cachenode.front.access import access, break_connection
from cachenode.front.exact_head import ExactResponse
from cachenode.front.object_head import add_peer_fields, object_headers, stored_decision
from cachenode.front.passed import ask_origin, passed_head
from cachenode.counts import answer_counts
from cachenode.kernel.sendfile import FileSender
from cachenode.front.short_answers import answer_precondition, answer_unsatisfiable, origin_failure
from cachenode.kernel.splice import BrokenStream, ClientGone
from cachenode.fill.assembly import PartWriter
from cachenode.fill.buffer import Fill
from cachenode.http.digests import carry
from cachenode.http.headers import drop_whole_body_fields, first, with_date
from cachenode.fill.upstream import Upstream
from cachenode.fill.origin import via_of
from cachenode.peers.auth import is_peer_request
from cachenode.peers.cuts import Cuts
from cachenode.http.conditionals import Outcome as RangeOutcome
from cachenode.http.conditionals import Decision, evaluate, preconditions
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.config import CacheSettings
from nezha.errors import FillAborted
from nezha.keys import host_of
from nezha.wire import DIGEST_HEADER, EXPIRES_HEADER, CacheOutcome
from nezha.wire import CHUNKED_HEADER, PEER_HEADER, SERVED_BY_HEADER
from nezha.ring import Peer

log = structlog.get_logger("nezha.serve")


class ChunkBody(Protocol):
    """How a chunked object's bytes are written (cachenode/chunks/reads.py `ChunkReads`)."""

    async def send(self, request: web.Request, resp: web.StreamResponse, meta: Meta, start: int,
                   length: int) -> None: ...


class Responder:
    def __init__(self, *, settings: CacheSettings, store: Store, upstream: Upstream, files: FileSender,
                 chunk_body: ChunkBody, count: Callable[..., None], clock: Callable[[], float] = time.time,
                 owners: Callable[[str], list[Peer]] = lambda key: []) -> None:
        """`owners(key)`: the key's owners in ring order (a peer among them reads a fill as its replica)."""
        self.settings = settings
        self._owners = owners
        self.store = store
        self.upstream = upstream
        self._count = count
        self._clock = clock
        self.via = via_of(settings.identity)
        self._files = files
        self.chunk_body = chunk_body  # a chunked object's bytes, read from its chunks' owners
        self.cuts = Cuts()  # the answers cut because their fill failed, for the peers that ask why (peers/cuts.py)

    def via_for(self, request: web.Request) -> str | None:
        """This node's Via entry for a response to `request`; none to a peer:
        a cluster is one cache, and the node that answers the client adds its own."""
        return None if is_peer_request(request, self.settings.cluster_token) else self.via

    def _client_gone(self, request: web.Request, *, host: str, key: str, sent: int, counted: bool = True,
                     **deltas: int) -> None:
        """A client hung up: log it once, count what it was sent (unless a relaying handler does: not `counted`)."""
        access(request).bytes = sent
        log.info("client_gone", key=key, bytes=sent)
        self._count(host, request=request, bytes_served=sent if counted else 0, **deltas)

    async def _bodyless(self, request: web.Request, answer: Awaitable[None], *, host: str, key: str) -> None:
        """Send an answer without a body (304, 412, 416); a client gone before it is logged once."""
        try:
            await answer
        except ConnectionError:
            self._client_gone(request, host=host, key=key, sent=0)

    async def hit(self, request: web.Request, meta: Meta, *, label: str,
                  stale_reason: str | None = None, body: bytes | None = None) -> web.StreamResponse | None:
        """Send a stored object; None if it vanished (evicted or replaced) first.
        `body`: its bytes, in memory still (a small object just stored from
        them): sent from there, with the head, its file neither opened nor checked."""
        if meta.chunk_size and is_peer_request(request, self.settings.cluster_token):
            return await self._manifest(request, meta, label=label)
        if body is not None and len(body) == meta.size and not meta.chunk_size:
            return await self._answer_stored(request, meta, label=label, stale_reason=stale_reason, f=None,
                                             body=body)
        try:
            # Opened on the loop: for a local data directory this is a cached
            # metadata lookup (microseconds), and an executor hop per hit cost
            # more than the open itself (docs/benchmarks.md, profile).
            # A chunked object's bytes are its chunks: no file of its own is read.
            f = None if meta.chunk_size else open(self.store.data_path(meta), "rb")
        except FileNotFoundError:
            return None
        if f is not None and not self.store.intact(meta, f.fileno()):
            f.close()
            self.store.damaged(meta)  # torn or changed on disk: never served; the read fetches it again
            return None
        try:
            return await self._answer_stored(request, meta, label=label, stale_reason=stale_reason, f=f)
        finally:
            if f is not None:
                f.close()

    async def _answer_stored(self, request: web.Request, meta: Meta, *, label: str, stale_reason: str | None,
                             f: IO[bytes] | None, body: bytes | None = None) -> web.StreamResponse | None:
        """`hit`'s answer once its bytes are at hand: the open file `f`, the
        `body` in memory, or (neither) a chunked object's chunks."""
        access(request).cache = label
        counted = answer_counts(label)  # {} for a relayed label: the relaying handler counts it
        decision = stored_decision(request, meta)
        if f is not None and meta.blocks and self.store.verify_reads and decision.length \
                and request.method != "HEAD":
            why = await asyncio.get_running_loop().run_in_executor(
                None, self.store.verify, meta, f.fileno(), decision.start, decision.length)
            if why is not None:  # a byte changed on disk: never served; the read fetches it again
                self.store.damaged(meta, found_by="read", why=why)
                return None
        resp = self._hit_response(request, meta, decision, label=label, stale_reason=stale_reason,
                                  counted=bool(counted), just_fetched=body is not None)
        if decision.outcome is RangeOutcome.NOT_MODIFIED or decision.outcome is RangeOutcome.PRECONDITION_FAILED:
            self._count(meta.host, request=request, **counted)
            await self._bodyless(request, answer_precondition(request, resp, decision.outcome),
                                 host=meta.host, key=meta.key)
            return resp
        if decision.outcome is RangeOutcome.UNSATISFIABLE:
            await self._bodyless(request, answer_unsatisfiable(request, resp, meta.body_size),
                                 host=meta.host, key=meta.key)
            return resp
        if decision.outcome is RangeOutcome.PARTIAL:
            end = decision.start + decision.length - 1
            resp.headers["Content-Range"] = f"bytes {decision.start}-{end}/{meta.body_size}"
            drop_whole_body_fields(resp.headers)
        resp.content_length = decision.length
        self._count(meta.host, request=request, **counted)
        if is_peer_request(request, self.settings.cluster_token):
            add_peer_fields(resp, meta, decision)
        await self._hit_body(request, resp, meta, f, decision, label=label, counted=bool(counted), body=body)
        return resp

    def _hit_response(self, request: web.Request, meta: Meta, decision: Decision, *, label: str,
                      stale_reason: str | None, counted: bool, just_fetched: bool = False) -> ExactResponse:
        """A stored object's response head, before Range and the peer's fields;
        not `counted`: a relaying handler counts the read (a chunked object's).
        `just_fetched`: the origin's answer to this flight, stored at once: its
        Age is the origin's, as a streamed fill's is (none when 0), not the
        time it has waited here."""
        resp = ExactResponse(status=meta.status if decision.outcome is RangeOutcome.FULL
                                  else decision.outcome.value)
        object_headers(resp, with_date(meta.headers, meta.stored_at), label, via=self.via_for(request),
                        age=(int(meta.age) or None) if just_fetched else meta.age_at(self._clock()),
                        want=request.headers.get("Want-Repr-Digest"),
                        status=meta.status)
        if meta.hot:  # a hot copy names the node whose disk serves it, as a relay names the owner
            resp.headers[SERVED_BY_HEADER] = self.settings.identity
        elif not counted and access(request).peer:  # a chunked object's read: the node that sent its manifest
            resp.headers[SERVED_BY_HEADER] = access(request).peer
        if stale_reason is not None:
            resp.headers["Warning"] = '111 - "Revalidation Failed"'
        if decision.outcome is RangeOutcome.NOT_MODIFIED and is_peer_request(request, self.settings.cluster_token):
            # A peer revalidating its hot copy renews it to this expiry, never beyond.
            resp.headers[EXPIRES_HEADER] = f"{meta.expires_at:.3f}"
        return resp

    async def _hit_body(self, request: web.Request, resp: ExactResponse, meta: Meta, f: IO[bytes] | None,
                        decision: Decision, *, label: str, counted: bool, body: bytes | None = None) -> None:
        """A stored object's head and body sent (from its file, or its chunks when `f` is None);
        a client gone is counted, a data file shorter than its meta breaks the connection.
        Not `counted`: the bytes are the relaying handler's to count."""
        sent = 0
        if body is not None and request.method != "HEAD" and decision.length:
            # With the head, in one send: the head waits in aiohttp's buffer for the first write
            # (a StreamResponse sends it at once by default, web.Response does not).
            resp._send_headers_immediately = False
        try:
            await resp.prepare(request)
            if request.method != "HEAD" and decision.length:
                if body is not None:
                    await resp.write(memoryview(body)[decision.start:decision.start + decision.length])
                elif f is None:
                    await self.chunk_body.send(request, resp, meta, decision.start, decision.length)
                else:
                    await self.send_file(request, resp, f, decision.start, decision.length)
                sent = decision.length
                self._count(meta.host, request=request, bytes_served=sent if counted else 0)
                access(request).bytes = sent
            await resp.write_eof()
        except ClientGone as e:
            self._client_gone(request, host=meta.host, key=meta.key, sent=e.sent, counted=counted)
        except ConnectionError:
            if not sent:
                self._client_gone(request, host=meta.host, key=meta.key, sent=0)
        except BrokenStream as e:  # the data file is shorter than its meta says
            access(request).cache = f"{label}-aborted"
            log.warning("stream_aborted", key=meta.key, error=str(e))
            break_connection(request)

    async def _manifest(self, request: web.Request, meta: Meta, *, label: str) -> web.StreamResponse:
        """A chunked object's manifest, to a peer: its headers, CHUNKED_HEADER
        (chunk size and length) and its expiry, no body. The peer reads the
        chunks from their owners itself (cachenode/chunks/reads.py), or keeps the
        manifest as its copy (a replica, a hand-off): the object's bytes never
        funnel through the node that holds its manifest."""
        access(request).cache = label
        resp = ExactResponse(status=200)
        object_headers(resp, with_date(meta.headers, meta.stored_at), label, via=None, age=meta.age_at(self._clock()))
        resp.headers.popall("Content-Length", None)
        manifest = meta.manifest
        assert manifest is not None, "only a chunked object's meta is sent as a manifest"
        resp.headers[CHUNKED_HEADER] = manifest.encode()
        resp.headers[EXPIRES_HEADER] = f"{meta.expires_at:.3f}"
        resp.content_length = 0
        self._count(meta.host, request=request, **answer_counts(label))
        try:
            await resp.prepare(request)
            await resp.write_eof()
        except ConnectionError:
            self._client_gone(request, host=meta.host, key=meta.key, sent=0)
        return resp

    async def send_file(self, request: web.Request, resp: web.StreamResponse, f: IO[bytes],
                        offset: int, count: int) -> None:
        """Bytes [offset, offset+count) of `f` to the client (`FileSender`);
        ClientGone, with the bytes that did leave, when the client hung up."""
        await self._files(request, resp, f, offset, count)

    async def fill(self, request: web.Request, fill: Fill, *, label: str) -> web.StreamResponse:
        """Stream an object while the origin is still sending it."""
        try:
            f = fill.open_reader()  # first, before any await: see run_fill_in_background
        except FillAborted as e:
            return await self._fill_ended(request, fill, label=label, error=e)
        host = host_of(fill.key)
        try:
            access(request).cache = label
            resp = ExactResponse()
            object_headers(resp, fill.headers, label, via=self.via_for(request), age=int(fill.age) or None,
                            want=request.headers.get("Want-Repr-Digest"), status=fill.status)
            checked = fill.checked_against
            if checked is not None and is_peer_request(request, self.settings.cluster_token):
                # The relay checks these bytes too: it may join them to a rest from elsewhere.
                resp.headers[DIGEST_HEADER] = carry(checked)
            span = await self._fill_span(request, resp, fill, host=host)
            if span is None:
                return resp  # answered without a body
            start, length = span
            offset = start
            end = None if length is None else start + length
            progress = [offset]  # how far the body got, also when sending it raised
            try:
                await resp.prepare(request)
                await self._follow(request, resp, fill, f, progress, end=end)
                offset = progress[0]
            except ClientGone as e:
                offset = progress[0]
                self._client_gone(request, host=host, key=fill.key, sent=offset + e.sent - start, misses=1)
                return resp
            except ConnectionError:
                offset = progress[0]
                self._client_gone(request, host=host, key=fill.key, sent=offset - start, misses=1)
                return resp
            except (FillAborted, BrokenStream) as e:
                offset = progress[0]
                access(request).cache = f"{label}-aborted"
                log.warning("stream_aborted", key=fill.key, sent=offset - start, error=str(e))
                self.cuts.note(fill.key, str(e))
                break_connection(request)
                return resp
            access(request).bytes = offset - start
            self._count(host, request=request, misses=1, bytes_served=offset - start)
            try:
                await resp.write_eof()
            except ConnectionError:
                pass  # every byte left; only the end of the framing did not
            return resp
        finally:
            f.close()

    async def _fill_span(self, request: web.Request, resp: ExactResponse, fill: Fill, *,
                         host: str) -> tuple[int, int | None] | None:
        """The part of a fill this request gets, its status and framing set on
        `resp`: (start, length; None while unknown), or None once a
        precondition or an unsatisfiable Range was answered without a body."""
        size = fill.length
        start, length = 0, size
        status = fill.status
        etag, last_modified = first(fill.headers, "ETag"), first(fill.headers, "Last-Modified")
        plain = fill.status != 200  # preconditions and Range apply to a 200 only
        verdict = None if plain else preconditions(request.headers, etag=etag, last_modified=last_modified)
        if verdict is not None:
            self._count(host, request=request, misses=1)
            await self._bodyless(request, answer_precondition(request, resp, verdict), host=host, key=fill.key)
            return None
        if size is not None and plain:
            resp.content_length = size
        elif size is not None:
            decision = evaluate(request.headers, size=size, etag=etag, last_modified=last_modified)
            if decision.outcome is RangeOutcome.PARTIAL:
                status, start, length = 206, decision.start, decision.length
                resp.headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{size}"
                drop_whole_body_fields(resp.headers)
            elif decision.outcome is RangeOutcome.UNSATISFIABLE:
                await self._bodyless(request, answer_unsatisfiable(request, resp, size), host=host, key=fill.key)
                return None
            resp.content_length = length
        else:
            resp.enable_chunked_encoding()
        resp.set_status(status)
        return start, length

    async def _follow(self, request: web.Request, resp: web.StreamResponse, fill: Fill, f: IO[bytes],
                      progress: list[int], *, end: int | None) -> None:
        """Send the fill's body from `progress[0]` up to `end` (None: its end) as
        it lands, keeping `progress[0]` at the offset sent so far."""
        offset = progress[0]
        # Another node's copy first: this node's own clients keep within a lead of it (front/copies_first.py),
        # and the fill within a window of the key's replica (fill/pace.py).
        asking, peer = request.headers.get(PEER_HEADER), is_peer_request(request, self.settings.cluster_token)
        paced = copies_first.reader(fill, peer=peer, offset=offset,
                                    replica=asking is not None and any(p.id == asking for p in self._owners(fill.key)))
        if peer:
            copies_first.unhurried(request.transport)
        try:
            while end is None or offset < end:
                available = await fill.wait_beyond(offset, reader=f, end=end)
                if end is not None:
                    available = min(available, end)
                if available <= offset:
                    break  # unknown length and the body is complete
                available = await paced.upto(offset, available)
                if fill.spilled and offset >= fill.on_disk:
                    # The store could not write: the fill hands these bytes over from memory.
                    data = fill.from_memory(f, offset, available)
                    await resp.write(data)
                    offset += len(data)
                    progress[0] = offset
                    paced.sent(offset)
                    continue
                if fill.spilled:
                    available = min(available, fill.on_disk)
                await self.send_file(request, resp, f, offset, available - offset)
                offset = progress[0] = available
                paced.sent(offset)
        finally:
            paced.close()
            if peer:
                copies_first.unhurried(request.transport, unsent=0)

    async def _fill_ended(self, request: web.Request, fill: Fill, *, label: str,
                          error: FillAborted) -> web.StreamResponse:
        """A joiner that woke after the fill ended and closed its reader.

        Stored: serve the object. Complete but not stored (too large for the
        store): ask the origin for this client, as for any unstorable
        response. Failed: the fill's error, naming the origin (502/504).
        """
        if fill.meta is not None:
            served = await self.hit(request, fill.meta, label=label)
            if served is not None:
                return served
        if fill.complete and fill.url is not None:
            return await self.passthrough(request, fill.url, label=CacheOutcome.PASS)
        raise origin_failure(error)

    async def passthrough(self, request: web.Request, url: str, *, label: str,
                          response: aiohttp.ClientResponse | None = None,
                          on_response: Callable[[aiohttp.ClientResponse], Awaitable[None]] | None = None,
                          keep: Callable[[aiohttp.ClientResponse], Awaitable[PartWriter | None]] | None = None,
                          ) -> web.StreamResponse:
        """Copy the origin's answer to this one client; store nothing, unless
        `keep` makes the answer a part of an object (fill/assembly.py): then
        each piece sent is written into its place too, and it is a `miss`.

        The request goes as the client sent it: every end-to-end field and
        the body, streamed (an upload is never held whole). `on_response` runs
        once the origin's status and headers are in, before the client sees
        them (a write's invalidation must be done by then).
        """
        access(request).cache = label
        if response is None:
            response = await ask_origin(self.upstream, request, url, via=self.via)
        part: PartWriter | None = None
        try:
            if on_response is not None:
                await on_response(response)
            if keep is not None and request.method == "GET" and (part := await keep(response)) is not None:
                label = CacheOutcome.MISS
                access(request).cache = label
            resp = passed_head(request, response, label=label, via=self.via_for(request))
            sent = received = 0
            gone = False
            try:
                await resp.prepare(request)
                if request.method != "HEAD":
                    async for chunk in response.content.iter_chunked(self.settings.read_size):
                        received += len(chunk)
                        await resp.write(chunk)
                        sent += len(chunk)
                        if part is not None:
                            await part.write(chunk)
                await resp.write_eof()
            except ConnectionError:  # the client hung up (aiohttp's ClientConnectionResetError is one too)
                gone = True
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                log.warning("pass_aborted", url=url, sent=sent, error=f"{type(e).__name__}: {e}")
                break_connection(request)
            # Stats go by the origin's configured host, not the upstream URL's.
            host = access(request).host or host_of(url)
            if self.upstream.answered_by_parent(response):
                self.upstream.received_from_parent(received)  # the parent's bytes, not an origin's
                received = 0
            if gone:
                self._client_gone(request, host=host, key=access(request).key or url, sent=sent,
                                  bytes_from_origin=received)
            else:
                access(request).bytes = sent
                self._count(host, request=request, bytes_served=sent, bytes_from_origin=received)
            return resp
        finally:
            response.release()
            if part is not None:
                await part.close()
