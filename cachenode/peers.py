"""Relaying a request to the key's owner, with failover that a job never notices.

A non-owner relays to the first live owner and streams both ways. If that
owner refuses, times out or answers 5xx, the next owner is asked; if one dies
mid-body, the relay resumes from the next owner with a Range request pinned
by If-Range to the same ETag, so the client sees one unbroken response.
If no owner can answer, the caller serves the request itself.

Relayed requests carry `X-Nezha-Peer`; a node never relays such a request
again, so each request crosses at most one peer hop even when two nodes
disagree about the ring.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Callable

import aiohttp
import structlog
from aiohttp import web

from cachenode.access import access
from cachenode import splice
from cachenode.cluster import Peer
from cachenode.keys import Target
from cachenode.origin import OriginClient, end_to_end
from nezha.errors import OriginError

log = structlog.get_logger("nezha.peers")

PEER_HEADER = "X-Nezha-Peer"
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class PeerRelay:
    def __init__(self, *, node_id: str, client: OriginClient, connect_timeout: float, read_timeout: float,
                 chunk_size: int, down_for: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 use_splice: bool = True) -> None:
        self.node_id = node_id
        self.client = client
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self.chunk_size = chunk_size
        self.down_for = down_for
        self._clock = clock
        self._down_until: dict[str, float] = {}
        self.splice = use_splice

    def mark_down(self, peer: Peer, why: str) -> None:
        self._down_until[peer.id] = self._clock() + self.down_for
        log.warning("peer_marked_down", peer=peer.id, address=peer.address, reason=why, seconds=self.down_for)

    def is_down(self, peer: Peer) -> bool:
        return self._down_until.get(peer.id, 0.0) > self._clock()

    def order(self, owners: list[Peer]) -> list[Peer]:
        """Owners in ring order, those recently failed last (still tried: they may be back)."""
        return [p for p in owners if not self.is_down(p)] + [p for p in owners if self.is_down(p)]

    def peer_headers(self, request: web.Request, target: Target) -> dict[str, str]:
        headers = end_to_end(request.headers)
        headers["Host"] = target.host
        headers[PEER_HEADER] = self.node_id
        return headers

    async def relay(self, request: web.Request, owners: list[Peer], *, target: Target) -> web.StreamResponse | None:
        """Serve `request` from an owner. None when no owner answered at all."""
        out: web.StreamResponse | None = None
        start = sent = 0
        end: int | None = None
        etag: str | None = None
        for peer in self.order(owners):
            if peer.id == self.node_id:
                continue
            headers = self.peer_headers(request, target)
            if out is not None:
                if end is None or etag is None or etag.startswith("W/"):
                    break  # cannot resume safely
                headers.pop("If-None-Match", None)
                headers.pop("If-Modified-Since", None)
                headers["Range"] = f"bytes={start + sent}-{end}"
                headers["If-Range"] = etag
            try:
                r = await self.client.request(request.method, peer.url + target.path_qs, headers=headers,
                                              what=f"peer {peer.id} ({peer.address})", timeout=self.timeout)
            except OriginError as e:
                self.mark_down(peer, str(e))
                continue
            try:
                if r.status >= 500:
                    self.mark_down(peer, f"answered {r.status}")
                    continue
                if out is None:
                    out = web.StreamResponse(status=r.status, reason=r.reason)
                    for name, value in end_to_end(r.headers).items():
                        out.headers.add(name, value)
                    label = f"peer-{r.headers.get('X-Nezha-Cache', 'unknown')}"
                    out.headers["X-Nezha-Cache"] = label
                    out.headers["X-Nezha-Served-By"] = peer.id
                    access(request).cache = label
                    access(request).peer = peer.id
                    if r.content_length is not None:
                        out.content_length = r.content_length
                    elif request.method != "HEAD" and r.status not in (204, 304):
                        out.enable_chunked_encoding()
                    start, end = _span(r)
                    etag = r.headers.get("ETag")
                    await out.prepare(request)
                else:
                    resumed = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
                    if r.status != 206 or not resumed or int(resumed.group(1)) != start + sent:
                        log.warning("peer_resume_refused", peer=peer.id, status=r.status, key_path=target.path)
                        break
                    log.info("peer_resumed", peer=peer.id, offset=start + sent, path=target.path)
                if request.method == "HEAD":
                    await out.write_eof()
                    return out
                def count(n: int) -> None:
                    nonlocal sent
                    sent += n

                try:
                    if self.splice and splice.usable(r, request):
                        await splice.splice_body(r, request, out, read_timeout=self.timeout.sock_read or 60,
                                                 on_bytes=count)
                    else:
                        async for chunk in r.content.iter_chunked(self.chunk_size):
                            await out.write(chunk)
                            count(len(chunk))
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    self.mark_down(peer, f"broke mid-body after {sent} bytes: {type(e).__name__}")
                    continue
                except splice.ClientGone as e:
                    log.info("client_gone", peer=peer.id, sent=sent, error=str(e))
                    access(request).broken = True
                    if request.transport is not None:
                        request.transport.abort()
                    return out
                access(request).bytes = sent
                await out.write_eof()
                return out
            finally:
                r.release()
        if out is not None:
            # Headers are out and no owner could finish the body: the client
            # must see a broken response, never a short one.
            access(request).broken = True
            if request.transport is not None:
                request.transport.abort()
            return out
        return None


def _span(r: aiohttp.ClientResponse) -> tuple[int, int | None]:
    """First and last byte offsets of the body in the whole object, if known."""
    if r.status == 206:
        m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
        if m:
            return int(m.group(1)), int(m.group(2))
    if r.status == 200 and r.content_length is not None:
        return 0, r.content_length - 1
    return 0, None
