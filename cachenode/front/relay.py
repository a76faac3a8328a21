"""Relaying a request to the key's owner, with failover that a job never notices.

Only the first live owner of a key fills it from the origin. A node asks
the owners *ahead of it* in ring order (every owner, for a non-owner; the
ones before it, for a replica) and streams the first answer both ways; if
none answers, the caller serves the request itself, so the next owner in
order becomes the filler when the first is down.

Failover, in the order a request meets it:

- **No answer.** A refused connection, a connect that takes longer than
  `peer_timeout`, or an owner's own 5xx moves on to the next owner and marks
  this one down for a few seconds (tried last, not skipped). An owner that
  answered within the last `ANSWERED_WITHIN` seconds is given
  `RECENT_CONNECT` times `peer_timeout` to connect (and to be probed): on a
  saturated link a new connection's SYN is dropped and sent again a second
  later, and a stampede marked busy owners down for it and read their
  chunks from the origin (docs/benchmarks.md, "Stampede"). A 5xx the owner
  passes on from the origin (`X-Nezha-Cache: pass`, or `X-Nezha-Origin-Error`
  on the owner's own 502/504) goes to the client as it is: asking another
  owner would only ask the same origin again.
- **Silence before the headers.** A hot owner answers within `peer_timeout`;
  a cold one sends its headers as soon as the origin sent its own, so it may
  legitimately wait up to the origin's connect plus read timeouts. The relay
  tells the two apart by asking the silent owner's `/healthz` (a liveness
  probe, bounded by `peer_timeout`) after each `peer_timeout` of silence: a
  frozen or wedged owner fails it and is given up after about twice
  `peer_timeout`; a live one is waited for up to `header_timeout`.
- **Silence or death mid-body.** The same probe runs whenever the body
  stops moving for `peer_timeout`; an owner that fails it is cut off. A body
  that breaks is resumed from the next owner with `Range: bytes=<sent>-`
  pinned by `If-Range` (a strong ETag, else a Last-Modified at least a second
  older than the response's Date, RFC 9110 §13.1.5), and when no owner is
  left, from the origin with the same two headers, so the client sees one
  unbroken response. Only when neither is possible is the client's
  connection cut: never a short body.
- **The filling owner dies under a stampede.** Every client relayed from it
  breaks at once. Those relayed through a non-owner resume from the next
  owner, whose flight serves them all. Those relayed through that next
  owner itself join the same flight: the node asks itself for the rest (as
  a peer would, so the request meets the flight like any other) before it
  would ask the origin. So the origin gets one resume for the missing range,
  not one per client, and the flight keeps what it fetched
  (cachenode/fill/parallel.py, a fill led by a resume).
- **An owner that cuts wrong bytes.** An owner whose fill fails its digest
  check cuts its clients before the last byte, which looks here exactly like
  an owner dying mid-body, so the rest is resumed as above. The resumed body
  may then join the wrong bytes already sent to a right rest. So a relayed
  200 whose head carries a whole-object digest (`http/digests.py`) is
  checked here too, across every resume, and the client is kept from its
  last byte until the check passes: on a mismatch its connection is cut
  (no clean end, no last chunk), and `digest_mismatch` is logged (source
  `relay`) and counted as a fill's is. Such a body goes through Python,
  not the kernel's splice: its bytes must be hashed (front/relay_digest.py).

Relayed requests carry `X-Nezha-Peer`; a node never relays such a request
again, so each request crosses at most one peer hop even when two nodes
disagree about the ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

import aiohttp
import structlog
from aiohttp import web

from cachenode.kernel import splice
from cachenode.front.access import access, break_connection
from nezha.ring import Peer
from cachenode.front.exact_head import ExactResponse
from cachenode.front.interim import InterimRelay
from cachenode.front.relay_digest import RelayedDigest
from cachenode.http.digests import Verifier, expectations
from cachenode.http.freshness import http_date
from nezha.keys import Target
from cachenode.fill.origin import Interim, OriginClient, add_via, end_to_end, forwarded_request_headers, via_of
from cachenode.cluster.peer_auth import peer_auth
from nezha.errors import OriginError, OriginTimeout
from nezha.wire import (CACHE_HEADER, CHUNK_HEADER, CHUNKED_HEADER, ORIGIN_ERROR_HEADER, PASSED_ON, PEER_HEADER, SCHEME_HEADER, SERVED_BY_HEADER,
                        TOKEN_HEADER, EXPIRES_HEADER, AUTHORIZE_HEADER, relayed)

if TYPE_CHECKING:
    from prometheus_client import Counter

log = structlog.get_logger("nezha.peers")

# Answers a relayed request whose owner sent a chunked object's manifest; None: it could not.
OnManifest = Callable[[web.Request, aiohttp.ClientResponse, Peer], Awaitable[web.StreamResponse | None]]
# Sees the first owner answer's head before it is relayed; answers the request
# itself (a hot copy the owner's 304 renewed), or None: relay the answer on.
OnAnswer = Callable[[web.Request, aiohttp.ClientResponse, Peer], Awaitable[web.StreamResponse | None]]

# On an owner's 502/504: the origin failed, not the owner (the value says how).
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
# Fields an owner sends only to the node that relays: never to its client.
_OWNER_ONLY = frozenset({EXPIRES_HEADER.lower(), AUTHORIZE_HEADER.lower()})
# What a resume logs, by where the rest came from: (resumed, refused, failed).
_RESUME_EVENTS = {"origin": ("origin_resumed", "origin_resume_refused", "origin_resume_failed"),
                  "here": ("resumed_here", "resume_here_refused", "resume_here_failed")}
_CONDITIONALS = ("If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since", "If-Range", "Range")


# An owner heard from this many seconds ago is taken to be alive, its link busy...
ANSWERED_WITHIN = 30.0
# ...and is given this many `peer_timeout`s to connect: a SYN dropped by a full
# link is sent again after 1 s, then 2 s later (Linux's initial RTO), both within
# 4 s at the default `peer_timeout` of 1 s.
RECENT_CONNECT = 4


class PeerSilent(OriginTimeout):
    """A peer took the connection but stopped answering, and failed its liveness probe."""


def from_origin(response: aiohttp.ClientResponse) -> bool:
    """Whether an owner's 5xx is the origin's failure passed on, not the owner's own."""
    return ORIGIN_ERROR_HEADER in response.headers or response.headers.get(CACHE_HEADER) in PASSED_ON


@dataclass
class _Body:
    """What the client has been promised, and how much of it went out."""

    out: web.StreamResponse
    start: int
    end: int | None  # last byte offset in the object, if known
    total: int | None  # the object's length, if known
    validator: str | None  # for If-Range, if a safe one exists
    sent: int = 0  # bytes taken from the sources: written to the client, or `held`
    # The check of the whole body against the digest its head published, if any.
    check: RelayedDigest | None = None
    held: bytes = b""  # the body's last byte, kept from the client until `check` passes
    first: str = ""  # the owner that began the body

    @property
    def left(self) -> int | None:
        """Bytes of the body not yet taken, if its end is known."""
        return None if self.end is None else self.end + 1 - self.start - self.sent

    @property
    def resumable(self) -> bool:
        return self.end is not None and self.validator is not None

    def resume_headers(self) -> dict[str, str]:
        assert self.end is not None and self.validator is not None
        return {"Range": f"bytes={self.start + self.sent}-{self.end}", "If-Range": self.validator}

    def continues(self, r: aiohttp.ClientResponse) -> bool:
        """`r` is exactly the rest of this body (RFC 9110 §14.4)."""
        m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
        if r.status != 206 or not m or int(m.group(1)) != self.start + self.sent or int(m.group(2)) != self.end:
            return False
        return self.total is None or m.group(3) == "*" or int(m.group(3)) == self.total


class PeerRelay:
    def __init__(self, *, node_id: str, client: OriginClient, peer_timeout: float, read_timeout: float,
                 header_timeout: float, read_size: int, down_for: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, use_splice: bool = True,
                 cluster_token: str | None = None, mismatches: "Counter | None" = None) -> None:
        """`peer_timeout` bounds the connect, each silence before a probe, and the probe.

        `header_timeout` bounds the wait for the headers of an owner that
        keeps passing its probe (a cold owner waiting for the origin);
        `read_timeout` bounds silence mid-body from such an owner.
        `mismatches`: nezha_digest_mismatches_total{origin}, which a relayed
        body that fails its digest check counts as a fill's does.
        """
        self.mismatches = mismatches
        self.node_id = node_id
        self.cluster_token = cluster_token
        self.client = client
        self.peer_timeout = peer_timeout
        self.header_timeout = header_timeout
        self.read_timeout = read_timeout
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=peer_timeout, sock_read=read_timeout)
        self.read_size = read_size
        self.down_for = down_for
        self._clock = clock
        self._down_until: dict[str, float] = {}
        self._answered_at: dict[str, float] = {}  # when each peer last answered (its headers, or a probe)
        self.splice = use_splice

    def mark_down(self, peer: Peer, why: str) -> None:
        self._down_until[peer.id] = self._clock() + self.down_for
        self._answered_at.pop(peer.id, None)  # its next connect is given `peer_timeout` again
        log.warning("peer_marked_down", peer=peer.id, address=peer.address, reason=why, seconds=self.down_for)

    def connect_budget(self, peer: Peer) -> float:
        """How long a connect to `peer` may take: `peer_timeout`, or
        RECENT_CONNECT times it for a peer that answered within ANSWERED_WITHIN seconds."""
        heard = self._answered_at.get(peer.id)
        if heard is not None and self._clock() - heard < ANSWERED_WITHIN:
            return self.peer_timeout * RECENT_CONNECT
        return self.peer_timeout

    def is_down(self, peer: Peer) -> bool:
        return self._down_until.get(peer.id, 0.0) > self._clock()

    def order(self, owners: list[Peer]) -> list[Peer]:
        """Owners in ring order, those recently failed last (still tried: they may be back)."""
        return [p for p in owners if not self.is_down(p)] + [p for p in owners if self.is_down(p)]

    def peer_headers(self, request: web.Request, target: Target) -> dict[str, str]:
        headers = end_to_end(request.headers)
        headers["Host"] = target.host
        headers.pop(TOKEN_HEADER, None)  # a client's, if it sent one: never forwarded
        # A client's chunk request would become this node's, made with its token:
        # only a node reading a chunked object asks for a chunk (cachenode/chunks/reads.py).
        headers.pop(CHUNK_HEADER, None)
        headers[PEER_HEADER] = self.node_id
        headers[SCHEME_HEADER] = target.scheme
        headers.update(peer_auth(self.cluster_token))
        return headers

    # -- talking to one peer ---------------------------------------------------------
    async def probe(self, peer: Peer) -> str | None:
        """None when `peer` answers `/healthz` within `peer_timeout` (its connect
        within `connect_budget`), else why it did not."""
        budget = self.connect_budget(peer)
        timeout = aiohttp.ClientTimeout(total=self.peer_timeout) if budget == self.peer_timeout else \
            aiohttp.ClientTimeout(total=None, sock_connect=budget, sock_read=self.peer_timeout)
        try:
            r = await self.client.request("GET", peer.url + "/healthz", headers={}, what=f"peer {peer.id} /healthz",
                                          timeout=timeout)
        except OriginTimeout:
            return f"it did not answer /healthz within {self.peer_timeout:g}s"
        except OriginError as e:
            return f"its liveness probe failed: {e}"
        try:
            if r.status != 200:
                return f"its /healthz answered {r.status}"
            self._answered_at[peer.id] = self._clock()
            return None
        finally:
            r.release()

    async def ask(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                  header_timeout: float | None = None, interim: Interim | None = None) -> aiohttp.ClientResponse:
        """`peer`'s response, once its headers are in; `interim` hears its 1xx
        answers (the origin's, passed on by the owner) before it.

        Raises OriginError if it cannot be reached, PeerSilent if it stays
        silent for `peer_timeout` and then fails a probe, OriginTimeout if it
        keeps passing probes but sends nothing within `header_timeout`.
        """
        loop = asyncio.get_running_loop()
        budget = self.header_timeout if header_timeout is None else header_timeout
        what = f"peer {peer.id} ({peer.address})"
        connect = self.connect_budget(peer)
        timeout = self.timeout if connect == self.peer_timeout else \
            aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=self.read_timeout)
        task = loop.create_task(self.client.request(method, url, headers=headers, what=what, timeout=timeout,
                                                    interim=interim))
        started = loop.time()
        response: aiohttp.ClientResponse | None = None
        try:
            while True:
                await asyncio.wait({task}, timeout=self.peer_timeout)
                if task.done():
                    response = task.result()
                    return response
                waited = loop.time() - started
                if waited >= budget:
                    raise OriginTimeout(f"{what}: no response headers within {budget:g}s")
                why = await self.probe(peer)
                if task.done():
                    response = task.result()
                    return response
                if why is not None:
                    raise PeerSilent(f"{what}: no response headers after {waited:.1f}s, and {why}")
        finally:
            if response is not None:
                self._answered_at[peer.id] = self._clock()
            if not task.done():
                task.cancel()
                for result in await asyncio.gather(task, return_exceptions=True):
                    if isinstance(result, aiohttp.ClientResponse):
                        result.release()
            elif response is None and not task.cancelled() and task.exception() is None:
                task.result().release()

    def guard(self, peer: Peer, response: aiohttp.ClientResponse, progress: Callable[[], int]) -> asyncio.Task:
        """Watch a body from `peer`: when `progress()` stands still for `peer_timeout`
        and `peer` then fails a probe, cut the connection so the reader fails
        now (and can resume elsewhere) rather than after `read_timeout`.

        A client that reads slowly, or an owner waiting on a slow origin,
        stands still too; they pass the probe and are left alone.
        """
        conn = response.connection
        sock = conn.transport.get_extra_info("socket") if conn is not None and conn.transport is not None else None

        async def watch() -> None:
            loop = asyncio.get_running_loop()
            last, moved_at = progress(), loop.time()
            while True:
                await asyncio.sleep(self.peer_timeout / 4)
                if progress() != last:
                    last, moved_at = progress(), loop.time()
                    continue
                if loop.time() - moved_at < self.peer_timeout:
                    continue
                why = await self.probe(peer)
                if why is None or progress() != last:
                    last, moved_at = progress(), loop.time()
                    continue
                log.warning("peer_stalled", peer=peer.id, address=peer.address, reason=why, at=last)
                if sock is not None:
                    # Shutdown reaches every descriptor of the socket, the
                    # splice's duplicate included; closing the transport would not.
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                response.close()
                return

        return asyncio.get_running_loop().create_task(watch())

    # -- the relay -----------------------------------------------------------------------
    async def relay(self, request: web.Request, owners: list[Peer], *, target: Target,
                    origin_url: str | None = None, on_manifest: OnManifest | None = None,
                    validators: dict[str, str] | None = None,
                    on_answer: OnAnswer | None = None, here: Peer | None = None) -> web.StreamResponse | None:
        """Serve `request` from an owner. None when no owner answered at all.

        `here`: this node, when it owns the key too; a body that broke with
        no owner ahead left is resumed from this node's own flight first.

        `origin_url` is where to fetch the rest of a body that broke with no
        owner left to resume from. `on_manifest` answers the request when an
        owner answers with a chunked object's manifest (CHUNKED_HEADER) instead
        of its bytes (cachenode/chunks/reads.py). `validators` replace the
        client's If-None-Match and If-Modified-Since (a hot copy's revalidation,
        cluster/hot_revalidation.py), and `on_answer` sees the owner's answer first.
        """
        interim = InterimRelay(request)
        try:
            return await self._relay(request, owners, target=target, origin_url=origin_url, interim=interim,
                                     on_manifest=on_manifest, validators=validators, on_answer=on_answer, here=here)
        finally:
            interim.close()

    async def _relay(self, request: web.Request, owners: list[Peer], *, target: Target, origin_url: str | None,
                     interim: InterimRelay, on_manifest: OnManifest | None = None,
                     validators: dict[str, str] | None = None,
                     on_answer: OnAnswer | None = None, here: Peer | None = None) -> web.StreamResponse | None:
        body: _Body | None = None
        for peer in self.order(owners):
            if peer.id == self.node_id:
                continue
            if body is not None and not body.resumable:
                break
            headers = self._headers_for(request, target, validators=validators, body=body)
            try:
                r = await self.ask(peer, request.method, peer.url + target.path_qs, headers=headers,
                                   interim=interim if body is None else None)
            except OriginError as e:
                self.mark_down(peer, str(e))
                continue
            try:
                if r.status >= 500 and not from_origin(r):
                    self.mark_down(peer, f"answered {r.status}")
                    continue
                if body is None and on_manifest is not None and r.status == 200 and CHUNKED_HEADER in r.headers:
                    answered = await on_manifest(request, r, peer)
                    if answered is not None:
                        return answered
                    continue
                if body is None and on_answer is not None:
                    answered = await on_answer(request, r, peer)
                    if answered is not None:
                        return answered
                if body is None:
                    body = await self._start(request, r, peer)
                elif not body.continues(r):
                    log.warning("peer_resume_refused", peer=peer.id, status=r.status,
                                content_range=r.headers.get("Content-Range"), path=target.path)
                    break
                else:
                    log.info("peer_resumed", peer=peer.id, offset=body.start + body.sent, path=target.path)
                if request.method == "HEAD":
                    await body.out.write_eof()
                    return body.out
                try:
                    await self._stream(request, r, body, peer=peer)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    self.mark_down(peer, f"broke mid-body after {body.sent} bytes: {type(e).__name__}")
                    continue
                except splice.ClientGone as e:
                    return self._client_gone(request, body, peer.id, e)
                return await self._finish(request, body, target)
            finally:
                r.release()
        if body is None:
            return None
        return await self._unfinished(request, body, origin_url=origin_url, target=target, here=here)

    def _headers_for(self, request: web.Request, target: Target, *, validators: dict[str, str] | None,
                     body: _Body | None):
        """The fields an owner is asked with: a hot copy's validators instead of
        the client's on the first ask, a resumed body's range on a later one."""
        headers = self.peer_headers(request, target)
        if validators is not None and body is None:
            for name in ("If-None-Match", "If-Modified-Since"):
                headers.popall(name, None)
            headers.update(validators)
        if body is not None:
            for name in _CONDITIONALS:
                headers.popall(name, None)
            headers.update(body.resume_headers())
        return headers

    async def _unfinished(self, request: web.Request, body: _Body, *, origin_url: str | None,
                          target: Target, here: Peer | None = None) -> web.StreamResponse:
        """No owner finished the body it began: the rest from this node's own
        flight when it owns the key, else from the origin, else a broken connection."""
        if here is not None and body.resumable and request.method == "GET":
            try:
                if await self._resume(request, body, url=here.url + target.path_qs, target=target,
                                      headers=self._headers_for(request, target, validators=None, body=body),
                                      source=here):
                    return await self._finish(request, body, target)
            except splice.ClientGone as e:
                return self._client_gone(request, body, here.id, e)
        if origin_url is not None and body.resumable and request.method == "GET":
            try:
                if await self._resume_from_origin(request, body, origin_url, target):
                    return await self._finish(request, body, target)
            except splice.ClientGone as e:
                return self._client_gone(request, body, "origin", e)
        # Headers are out and nothing could finish the body: the client must
        # see a broken response, never a short one.
        log.warning("relay_broken", path=target.path, sent=body.sent, resumable=body.resumable)
        break_connection(request)
        return body.out

    async def _start(self, request: web.Request, r: aiohttp.ClientResponse, peer: Peer) -> _Body:
        out = ExactResponse(status=r.status, reason=r.reason)
        for name, value in end_to_end(r.headers, drop=_OWNER_ONLY).items():
            out.headers.add(name, value)
        add_via(out.headers, via_of(self.node_id))
        label = relayed(r.headers.get(CACHE_HEADER, "unknown"))
        out.headers[CACHE_HEADER] = label
        out.headers[SERVED_BY_HEADER] = peer.id
        access(request).cache = label
        access(request).peer = peer.id
        if r.content_length is not None:
            out.content_length = r.content_length
        elif request.method != "HEAD" and r.status not in (204, 304):
            out.enable_chunked_encoding()
        start, end, total = _span(r)
        body = _Body(out=out, start=start, end=end, total=total, validator=_validator(r), first=peer.id)
        if request.method == "GET":
            # Only a 200's digests are of the whole body (`expectations` says
            # none for any other status); the cheapest one is checked.
            expected = expectations(r.headers.items(), status=r.status).cheapest()
            if expected is not None:
                body.check = RelayedDigest(Verifier(expected))
        await out.prepare(request)
        return body

    async def _stream(self, request: web.Request, r: aiohttp.ClientResponse, body: _Body, *,
                      peer: Peer | None) -> None:
        """The rest of `r`'s body to the client; raises ClientError or TimeoutError if `r` breaks."""
        def count(n: int) -> None:
            body.sent += n

        watch = self.guard(peer, r, lambda: body.sent) if peer is not None else None
        check = body.check
        try:
            if check is None and self.splice and splice.usable(r, request):
                await splice.splice_body(r, request, body.out, read_timeout=self.read_timeout, on_bytes=count)
            else:
                async for chunk in r.content.iter_chunked(self.read_size):
                    taken = len(chunk)
                    if check is not None:
                        await check.feed(chunk)
                        left = body.left
                        if left is not None and len(chunk) >= left:
                            # The body's last byte waits for the check (`_finish`).
                            body.held, chunk = chunk[left - 1:left], chunk[:left - 1]
                    try:
                        if chunk:
                            await body.out.write(chunk)
                    except ConnectionError as e:  # aiohttp's reset error is a ClientError too: not the owner's
                        raise splice.ClientGone(f"client socket: {e}") from e
                    count(taken)
        finally:
            if watch is not None:
                watch.cancel()

    async def _resume_from_origin(self, request: web.Request, body: _Body, url: str, target: Target) -> bool:
        """Fetch the rest of the body from the origin; False if it cannot be had."""
        headers = forwarded_request_headers(request.headers, via=via_of(self.node_id))
        for name in _CONDITIONALS:
            headers.popall(name, None)
        headers.update(body.resume_headers())
        return await self._resume(request, body, url=url, headers=headers, target=target, source=None)

    async def _resume(self, request: web.Request, body: _Body, *, url: str, headers, target: Target,
                      source: Peer | None) -> bool:
        """The rest of the body from `url` (the origin, or `source`: this node's own
        flight, asked as a peer asks); False if it cannot be had there."""
        offset = body.start + body.sent
        resumed, refused, failed = _RESUME_EVENTS["origin" if source is None else "here"]
        try:
            if source is None:
                r = await self.client.request("GET", url, headers=headers, what=f"origin {url}")
            else:
                r = await self.ask(source, "GET", url, headers=headers)
        except OriginError as e:
            log.warning(failed, path=target.path, offset=offset, error=str(e))
            return False
        try:
            if not body.continues(r):
                log.warning(refused, path=target.path, offset=offset, status=r.status,
                            content_range=r.headers.get("Content-Range"))
                return False
            log.info(resumed, path=target.path, offset=offset)
            try:
                await self._stream(request, r, body, peer=None)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                log.warning(failed, path=target.path, offset=offset, sent=body.sent,
                            error=f"{type(e).__name__}: {e}")
                return False
            return True
        finally:
            r.release()

    async def _finish(self, request: web.Request, body: _Body, target: Target) -> web.StreamResponse:
        """The whole body came: its last byte and a clean end, once its digest
        (if its head published one) matches; else the client is cut."""
        if body.check is not None:
            mismatch = await body.check.mismatch()
            if mismatch is not None:
                log.error("digest_mismatch", origin=target.host, key=access(request).key or target.path,
                          source="relay", peer=body.first, field=mismatch.expected.field,
                          expected=mismatch.expected.shown(), got=mismatch.got, bytes=mismatch.length)
                if self.mismatches is not None:
                    self.mismatches.labels(origin=target.host).inc()
                access(request).bytes = body.sent - len(body.held)
                break_connection(request)
                return body.out
            if body.held:
                try:
                    await body.out.write(body.held)
                except ConnectionError as e:
                    return self._client_gone(request, body, body.first, e)
        access(request).bytes = body.sent
        await body.out.write_eof()
        return body.out

    @staticmethod
    def _client_gone(request: web.Request, body: _Body, source: str, error: Exception) -> web.StreamResponse:
        log.info("client_gone", peer=source, bytes=body.sent, error=str(error))
        access(request).bytes = body.sent
        break_connection(request)
        return body.out


def _span(r: aiohttp.ClientResponse) -> tuple[int, int | None, int | None]:
    """First and last byte offsets of the body in the whole object, and its length, if known."""
    if r.status == 206:
        m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
        if m:
            return int(m.group(1)), int(m.group(2)), None if m.group(3) == "*" else int(m.group(3))
    if r.status == 200 and r.content_length is not None:
        return 0, r.content_length - 1, r.content_length
    return 0, None, None


def _validator(r: aiohttp.ClientResponse) -> str | None:
    """What may pin a resumed range with If-Range (RFC 9110 §13.1.5): a strong
    ETag, else a Last-Modified that is strong by §8.8.2.2 (at least a second
    before the response's Date). None when neither is safe."""
    if r.status not in (200, 206):
        return None
    etag = r.headers.get("ETag")
    if etag:
        return None if etag.startswith("W/") else etag
    last_modified, date = r.headers.get("Last-Modified"), r.headers.get("Date")
    lm, sent_at = http_date(last_modified), http_date(date)
    if last_modified and lm is not None and sent_at is not None and sent_at - lm >= 1:
        return last_modified
    return None
