"""The body a relay promised its client, and the loop that pours it out.

Once an owner's head has gone to the client, the client has been promised
one whole body: the relay may take its bytes from several sources (the
first owner, the next one, this node's own flight, the origin) but must
never end it short. `RelayedBody` keeps what was promised (its span in the
object, and a validator that may pin a resume to the same version) and how
much of it went out; the functions here start it from an owner's answer,
pour a source's bytes into it, and end it cleanly or cut it.

A body from an owner's fill in progress whose head carries a whole-object
digest (`http/digests.py`, or the owner's `X-Nezha-Digest`) is checked
across every source, and its last byte is held back until the check passes
(fill/streamed_digest.py): that fill may yet be cut for a mismatch, a resume
would join the wrong bytes already sent to a right rest, and a cut
connection is the only way to tell the client. Such a body goes through
Python, not the kernel's splice: its bytes must be hashed. A body from the
owner's disk (`FROM_DISK`) is spliced unhashed: it was checked when it was
stored, and nothing cuts a hit for a wrong byte; its digest (`known`) still
goes with every resume, whose source checks the whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import aiohttp
import structlog
from aiohttp import web

from cachenode.kernel import splice
from cachenode.front.access import access, break_connection
from nezha.ring import Peer
from cachenode.front.exact_head import ExactResponse
from cachenode.peers.asks import PeerAsks
from cachenode.fill.streamed_digest import StreamedDigest
from cachenode.http.digests import Expectations, Expected, Verifier, carried, expectations
from cachenode.http.fields import http_date
from nezha.keys import Target
from cachenode.fill.origin import add_via, end_to_end, via_of
from nezha.wire import (AUTHORIZE_HEADER, BLOCKS_HEADER, CACHE_HEADER, DIGEST_HEADER, EXPIRES_HEADER, SERVED_BY_HEADER, CacheOutcome,
                        relayed)

log = structlog.get_logger("nezha.peers")

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
# Fields an owner sends only to the node that relays: never to its client.
_OWNER_ONLY = frozenset(name.lower() for name in (EXPIRES_HEADER, AUTHORIZE_HEADER, DIGEST_HEADER, BLOCKS_HEADER))
# An owner's answers from its disk: bytes its fill checked against the digest
# before it stored them, so relayed by splice, unhashed (see the module's docstring).
FROM_DISK = frozenset({CacheOutcome.HIT, CacheOutcome.HOT_HIT, CacheOutcome.STALE, CacheOutcome.REVALIDATED,
                       CacheOutcome.AUTHORIZED})


@dataclass
class RelayedBody:
    """What the client has been promised, and how much of it went out."""

    out: web.StreamResponse
    start: int
    end: int | None  # last byte offset in the object, if known
    total: int | None  # the object's length, if known
    validator: str | None  # for If-Range, if a safe one exists
    sent: int = 0  # bytes taken from the sources: written to the client, or `held`
    # The check of the whole body against the digest its head published, if any.
    check: StreamedDigest | None = None
    held: bytes = b""  # the body's last byte, kept from the client until `check` passes
    first: str = ""  # the owner that began the body
    # The whole-object digest of the head the body began with, checked or
    # not: handed to the sources of a resume, whose fills check it.
    known: Expected | None = None

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


async def start_body(asks: PeerAsks, request: web.Request, r: aiohttp.ClientResponse, peer: Peer) -> RelayedBody:
    """The client's response begun from owner `peer`'s answer `r`: its head sent, its body promised."""
    out = ExactResponse(status=r.status, reason=r.reason)
    for name, value in end_to_end(r.headers, drop=_OWNER_ONLY).items():
        out.headers.add(name, value)
    add_via(out.headers, via_of(asks.node_id))
    label = relayed(r.headers.get(CACHE_HEADER, "unknown"))
    out.headers[CACHE_HEADER] = label
    out.headers[SERVED_BY_HEADER] = peer.id
    access(request).cache = label
    access(request).peer = peer.id
    if r.content_length is not None:
        out.content_length = r.content_length
    elif request.method != "HEAD" and r.status not in (204, 304):
        out.enable_chunked_encoding()
    start, end, total = span(r)
    body = RelayedBody(out=out, start=start, end=end, total=total, validator=validator(r), first=peer.id)
    if request.method == "GET" and r.status == 200:
        body.known = known_digest(r)
        if body.known is not None and r.headers.get(CACHE_HEADER) not in FROM_DISK:
            body.check = StreamedDigest(Verifier(body.known))
    await out.prepare(request)
    return body


async def stream_body(asks: PeerAsks, request: web.Request, r: aiohttp.ClientResponse, body: RelayedBody, *,
                      peer: Peer | None) -> None:
    """The rest of `r`'s body to the client; raises ClientError or TimeoutError if `r` breaks."""
    def count(n: int) -> None:
        body.sent += n

    watch = asks.guard(peer, r, lambda: body.sent) if peer is not None else None
    check = body.check
    try:
        if check is None and asks.splice and splice.usable(r, request):
            await splice.splice_body(r, request, body.out, read_timeout=asks.read_timeout, on_bytes=count)
        else:
            async for chunk in r.content.iter_chunked(asks.read_size):
                taken = len(chunk)
                if check is not None:
                    await check.feed(chunk)
                    left = body.left
                    if left is not None and len(chunk) >= left:
                        # The body's last byte waits for the check (`finish_body`).
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


async def finish_body(asks: PeerAsks, request: web.Request, body: RelayedBody, target: Target) -> web.StreamResponse:
    """The whole body came: its last byte and a clean end, once its digest
    (if its head published one) matches; else the client is cut."""
    if body.check is not None:
        mismatch = await body.check.mismatch()
        if mismatch is not None:
            log.error("digest_mismatch", origin=target.host, key=access(request).key or target.path,
                      source="relay", peer=body.first, field=mismatch.expected.field,
                      expected=mismatch.expected.shown(), got=mismatch.got, bytes=mismatch.length)
            if asks.mismatches is not None:
                asks.mismatches.labels(origin=target.host).inc()
            access(request).bytes = body.sent - len(body.held)
            break_connection(request)
            return body.out
        if body.held:
            try:
                await body.out.write(body.held)
            except ConnectionError as e:
                return client_gone(request, body, body.first, e)
    access(request).bytes = body.sent
    await body.out.write_eof()
    return body.out


def client_gone(request: web.Request, body: RelayedBody, source: str, error: Exception) -> web.StreamResponse:
    """The client went away mid-body: its connection is cut, and what it took is logged."""
    log.info("client_gone", peer=source, bytes=body.sent, error=str(error))
    access(request).bytes = body.sent
    break_connection(request)
    return body.out


def known_digest(r: aiohttp.ClientResponse) -> Expected | None:
    """The whole-object digest an owner's 200 is known by: the cheapest its
    head publishes or the owner's fill checks (DIGEST_HEADER: Hugging Face's
    X-Linked-ETag came on a redirect this node may never have seen)."""
    handed = carried(r.headers.get(DIGEST_HEADER))
    published = expectations(r.headers.items(), status=200).expected
    return Expectations((*published, *((handed,) if handed is not None else ()))).cheapest()


def span(r: aiohttp.ClientResponse) -> tuple[int, int | None, int | None]:
    """First and last byte offsets of the body in the whole object, and its length, if known."""
    if r.status == 206:
        m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
        if m:
            return int(m.group(1)), int(m.group(2)), None if m.group(3) == "*" else int(m.group(3))
    if r.status == 200 and r.content_length is not None:
        return 0, r.content_length - 1, r.content_length
    return 0, None, None


def validator(r: aiohttp.ClientResponse) -> str | None:
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
