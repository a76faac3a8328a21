"""A client's read relayed to the key's owners ahead of this node, and what
this node does with their answer (docs/cache-node.md, "Peers").

The relay itself (timeouts, resuming a broken body) is `front/relay.py`'s;
this is the bookkeeping around it: counting what the owner answered, a
chunked object read from its chunks' owners here rather than through the
manifest's owner, and a hot copy's revalidation with its owner, whose 304
renews the copy so this node serves it (the policy is
cluster/hot_copies.py's: what to copy, when, and the copy's life).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import aiohttp
import structlog
from aiohttp import web

from cachenode.cluster.hot_copies import HotCheck, HotCopies, Relayed
from cachenode.cluster.hot_revalidation import confirms
from cachenode.cluster.streaming_copies import HeadRead, ManifestAnswer, StreamingCopies
from cachenode.counts import Counts
from cachenode.fill.flights import Flight, Kind
from cachenode.front.access import access
from cachenode.front.names import Asked
from cachenode.front.relay import PeerRelay
from cachenode.front.respond import Responder
from cachenode.http.freshness import current_age
from cachenode.http.headers import stored_pairs
from cachenode.store.objects import Meta
from nezha.chunks import Manifest
from nezha.errors import NezhaError
from nezha.keys import host_of
from nezha.ring import Peer
from nezha.wire import CACHE_HEADER, CHUNKED_HEADER, EXPIRES_HEADER, CacheOutcome, relayed

log = structlog.get_logger("nezha.cachenode")

# The owner's X-Nezha-Cache, as seen by the relay -> the relay's counter.
_RELAY_OUTCOME = {relayed(CacheOutcome.HIT): "peer_hits", relayed(CacheOutcome.AUTHORIZED): "peer_hits",
                  relayed(CacheOutcome.REVALIDATED): "peer_hits", relayed(CacheOutcome.STALE): "peer_hits",
                  relayed(CacheOutcome.MISS): "misses", relayed(CacheOutcome.MISS_JOINED): "misses"}


class RelayedReads:
    def __init__(self, *, node_id: str, relay: PeerRelay, respond: Responder, hot: HotCopies, counts: Counts,
                 streaming: StreamingCopies | None = None, clock: Callable[[], float] = time.time) -> None:
        self.node_id = node_id
        self.relay = relay
        self.respond = respond
        self.hot = hot
        self.streaming = streaming  # a stampede's readers here share one stream (cluster/streaming_copies.py)
        self.counts = counts
        self._clock = clock

    async def read(self, request: web.Request, asked: Asked, *, ahead: list[Peer], owners: list[Peer],
                   revalidating: HotCheck | None, authorize: bool) -> web.StreamResponse | None:
        """`request` answered by the owners `ahead` (or from a hot copy their
        304 renewed, or from this node's copy streaming in from them); None:
        none of them answered."""
        head: HeadRead | None = None
        answer: web.StreamResponse | None = None
        if (self.streaming is not None and revalidating is None and not authorize
                and self.streaming.shares(request.method, request.headers)):
            found = await self.streaming.joinable(asked.key)
            if isinstance(found, ManifestAnswer):
                # The head read's owner answered with the manifest: its chunks are read from here.
                answer = await self.chunked_from_peer(request, found.answer, found.peer)
            elif found is not None and (joined := await self._from_copy(request, found)) is not None:
                return joined
            if answer is None:
                head = self.streaming.head(asked.key)
        if answer is None:
            answer = await self._relayed(request, asked, ahead=ahead, owners=owners, revalidating=revalidating,
                                         head=head)
        if revalidating is not None and revalidating.served:
            return answer  # from this node's renewed copy, counted as the hit it is
        if head is not None and head.taken:
            return answer  # from this node's copy as it streamed in, counted as the miss it is
        if answer is None:
            return None
        record = access(request)
        outcome = _RELAY_OUTCOME.get(record.cache or "")
        self.counts.count(asked.target.host, metrics=False, bytes_served=record.bytes,
                          **({outcome: 1} if outcome else {}))
        if request.method == "GET":
            # A copy the owner's answer replaced is copied again at once:
            # the key was hot, and its readers keep coming here.
            self.hot.relayed(Relayed(cache=record.cache, peer=record.peer, broken=record.broken,
                                     status=answer.status, headers=answer.headers,
                                     content_length=answer.content_length),
                             ahead=ahead, owners=owners, target=asked.target, key=asked.key,
                             request_headers=request.headers, authorize=authorize,
                             replaced=revalidating is not None and revalidating.replaced)
        return answer

    async def _relayed(self, request: web.Request, asked: Asked, *, ahead: list[Peer], owners: list[Peer],
                       revalidating: HotCheck | None, head: HeadRead | None) -> web.StreamResponse | None:
        """The relay to the owners `ahead`; `head`: this read leads the key's head here."""
        on_answer = None if revalidating is None else self._hot_answer(revalidating, ahead=ahead, asked=asked)
        on_manifest = self.chunked_from_peer if head is None else self._manifest_after_head(head)
        try:
            return await self.relay.relay(request, ahead, target=asked.target, origin_url=asked.url,
                                          on_manifest=on_manifest,
                                          validators=revalidating.fields if revalidating else None,
                                          on_answer=on_answer,
                                          on_head=None if head is None else self._copy_answer(head, asked, ahead=ahead,
                                                                                            owners=owners),
                                          here=next((p for p in owners if p.id == self.node_id), None))
        finally:
            if head is not None:
                assert self.streaming is not None
                self.streaming.settle(head)  # no copy came of its answer: the reads waiting on it relay on their own

    async def for_peer(self, request: web.Request, asked: Asked) -> web.StreamResponse | None:
        """A node this one feeds asks for its copy (`only-if-cached`, a plain GET): this node's copy
        as it streams in, if it makes one (cluster/streaming_copies.py); None: it has none."""
        if self.streaming is None or not self.streaming.shares(request.method, {}):
            return None
        flight = await self.streaming.for_peer(asked.key)
        return None if flight is None else await self._from_copy(request, flight)

    async def _from_copy(self, request: web.Request, flight: Flight) -> web.StreamResponse | None:
        """`request` served from this node's copy streaming in (`hot-miss`); None: that copy failed
        before its first byte, or holds another variant (the read is relayed)."""
        outcome = await asyncio.shield(flight.outcome)
        if outcome.kind is not Kind.STREAMING or outcome.fill is None or not outcome.answers(request.headers):
            return None
        return await self.respond.fill(request, outcome.fill, label=CacheOutcome.HOT_MISS)

    def _manifest_after_head(self, head: HeadRead):
        """`chunked_from_peer` for a head read: a manifest is no body to copy, so
        the reads waiting on the head read the chunks with it at once (sharing
        one request per chunk here), not after this whole read, and without
        asking the owner again on links the wave has filled by then."""
        assert self.streaming is not None
        streaming = self.streaming

        async def on_manifest(request: web.Request, answer: aiohttp.ClientResponse,
                              peer: Peer) -> web.StreamResponse | None:
            streaming.settle(head, ManifestAnswer(answer=answer, peer=peer))
            return await self.chunked_from_peer(request, answer, peer)

        return on_manifest

    def _copy_answer(self, head: HeadRead, asked: Asked, *, ahead: list[Peer], owners: list[Peer]):
        """The relay's look at the owner's answer to the head read: when it
        becomes this node's copy (cluster/streaming_copies.py `take`), the head
        read is served from that copy as it streams in, like the reads waiting on it."""
        assert self.streaming is not None
        streaming = self.streaming

        async def on_head(request: web.Request, answer: aiohttp.ClientResponse,
                          peer: Peer) -> web.StreamResponse | None:
            try:
                fill = await streaming.take(head, answer, peer, target=asked.target, url=asked.url,
                                            origin=asked.origin, owners=owners, ahead=ahead)
            except NezhaError as e:
                raise web.HTTPBadGateway(text=f"{asked.key}: {e}\n") from e
            if fill is None:
                return None
            return await self.respond.fill(request, fill, label=CacheOutcome.HOT_MISS)

        return on_head

    def _hot_answer(self, check: HotCheck, *, ahead: list[Peer], asked: Asked):
        """The relay's look at the owner's answer to a hot copy's revalidation.

        A 304 about the copy's version: renew the copy with the owner's
        expiry and serve the client from this node's disk (`hot-hit`, its
        own conditionals and Range judged against the copy). Any other
        answer is relayed as it is, and one that says the owner's version is
        not the copy's (a 2xx, a 304 about the client's version, a 404) drops
        the copy first, so no reader here gets the old bytes after it."""
        async def on_answer(request: web.Request, answer: aiohttp.ClientResponse,
                            peer: Peer) -> web.StreamResponse | None:
            meta = check.meta
            if answer.status == 304 and confirms(etag=meta.etag, answer_etag=answer.headers.get("ETag"),
                                                 client_if_none_match=check.client_if_none_match):
                return await self._renewed(request, answer, peer, check, ahead=ahead, asked=asked)
            if answer.status < 500 and answer.status != 412:
                check.replaced = 200 <= answer.status < 300
                await self.hot.drop(meta, why="replaced at the owner")
            elif not meta.fresh(self._clock()):
                await self.hot.drop(meta, why="expired")
            return None

        return on_answer

    async def _renewed(self, request: web.Request, answer: aiohttp.ClientResponse, peer: Peer, check: HotCheck, *,
                       ahead: list[Peer], asked: Asked) -> web.StreamResponse:
        """The owner's 304 confirmed the hot copy: served from here once renewed, else relayed again."""
        meta = check.meta
        renewed = await self.hot.renew(meta, answer, origin=asked.origin)
        if renewed is not None:
            log.info("hot_copy_revalidated", key=meta.key, owner=peer.id,
                     expires_in=round(renewed.expires_at - self._clock(), 3))
            served = await self.respond.hit(request, renewed, label=CacheOutcome.HOT_HIT)
            if served is not None:
                check.served = True
                return served
        # Renewed as something else, or gone meanwhile: ask again, as any relayed read.
        again = await self.relay.relay(request, ahead, target=asked.target, origin_url=asked.url,
                                       on_manifest=self.chunked_from_peer)
        if again is None:
            raise web.HTTPServiceUnavailable(
                text=f"{meta.key}: its owners stopped answering while {self.node_id} renewed its copy\n")
        return again

    async def chunked_from_peer(self, request: web.Request, answer: aiohttp.ClientResponse,
                                peer: Peer) -> web.StreamResponse | None:
        """The owner of a chunked object's key answered a relayed read with its
        manifest (CHUNKED_HEADER): this node reads the chunks from their owners
        itself and answers the client, so the object's bytes do not funnel
        through the manifest's owner. None: a manifest that cannot be read
        (the relay then goes on as if the owner had not answered)."""
        try:
            manifest = Manifest.decode(answer.headers[CHUNKED_HEADER])
            expires_at = float(answer.headers[EXPIRES_HEADER])
        except (KeyError, ValueError, TypeError) as e:
            log.warning("manifest_unreadable", peer=peer.id, error=f"{type(e).__name__}: {e}")
            return None
        key = access(request).key or ""
        now = self._clock()
        meta = Meta(key=key, url=key, host=host_of(key), size=0, headers=stored_pairs(answer.headers),
                    stored_at=now, expires_at=expires_at, age=current_age(answer.headers, now),
                    chunk_size=manifest.chunk_size, length=manifest.length)
        access(request).peer = peer.id
        # The owner's own outcome (a miss when its flight stored the manifest just now), as a relay says it.
        return await self.respond.hit(request, meta, label=relayed(answer.headers.get(CACHE_HEADER, CacheOutcome.HIT)))
