"""Hot copies and a replica's copy after a relayed read: which reads make a
node copy an object from its owner, and the life of the copy here
(docs/cache-node.md, "Hot copies").

Policy about the cluster, so it lives in `cluster/`: the counting is
`hotness.py`'s and the revalidation's rules `hot_revalidation.py`'s (both
pure); this holds the state (keys being copied now) and the store and
hand-off calls. The front tells it what a relay answered (`relayed`) and
asks it how to revalidate a hot copy with its owner (`check`); serving the
client from the renewed copy stays the front's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping

import aiohttp
import structlog

from cachenode.cluster.handoff import Handoff
from cachenode.cluster.hot_revalidation import conditional_fields, owner_expiry
from cachenode.cluster.hotness import HotReads
from cachenode.cluster_view import ClusterView
from cachenode.counts import Counts
from cachenode.http.freshness import current_age
from cachenode.http.headers import renewed_by_304
from cachenode.http.vary import selecting_headers, vary_names
from cachenode.http.vary import variant as variant_of
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.config import CacheSettings, Origin
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import EXPIRES_HEADER, CacheOutcome, relayed

log = structlog.get_logger("nezha.cachenode")

# What a relay's answer said, as the access record has it: an owner's copy answered from its disk.
_FROM_OWNERS_DISK = (relayed(CacheOutcome.HIT), relayed(CacheOutcome.REVALIDATED))


@dataclass
class HotCheck:
    """One request's revalidation of a hot copy with the key's owner."""

    meta: Meta
    fields: dict[str, str]  # the conditional fields sent instead of the client's
    client_if_none_match: str | None
    served: bool = False  # answered from the renewed copy here (the front's look at the owner's answer)
    replaced: bool = False  # the owner answered 2xx: its version is not the copy's


@dataclass(frozen=True)
class Relayed:
    """What a relayed GET's owner answered, as the access record and the answer say it."""

    cache: str | None  # the record's cache outcome (relayed(...))
    peer: str | None  # which owner answered
    broken: bool  # the answer broke off mid-body
    status: int
    headers: Mapping[str, str]  # the answer's
    content_length: int | None


class HotCopies:
    def __init__(self, *, settings: CacheSettings, store: Store, cluster: ClusterView, handoff: Handoff,
                 counts: Counts, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.node_id = settings.identity
        self.store = store
        self.cluster = cluster
        self.handoff = handoff
        self.counts = counts
        self._clock = clock
        # Relayed reads counted per key; keys being copied now.
        self.hot = HotReads(reads=settings.hot_reads, window=settings.hot_window)
        self._copying: set[str] = set()

    def relayed(self, answer: Relayed, *, ahead: list[Peer], owners: list[Peer], target: Target, key: str,
                request_headers: Mapping[str, str], authorize: bool, replaced: bool) -> None:
        """After a GET relayed to `ahead`: a replica keeps a copy of what an
        owner answered from its disk; a non-owner counts the read, and copies
        a hot key (`replaced`: the owner's answer replaced this node's hot
        copy, so the key is hot already and is copied again at once)."""
        if len(ahead) < len(owners):
            self._keep_copy(answer, ahead, target)
        elif not authorize:
            self._count_hot_read(answer, ahead, target, key=key, request_headers=request_headers, at_once=replaced)

    def _keep_copy(self, answer: Relayed, ahead: list[Peer], target: Target) -> None:
        """A replica that relayed an owner's hit copies the object, so it holds
        its replica from now on. After a miss there is nothing to do: the
        owner's fill pushes the copy here when it completes."""
        if answer.broken or answer.cache not in _FROM_OWNERS_DISK:
            return
        peer = next((p for p in ahead if p.id == answer.peer), None)
        if peer is not None:
            self.handoff.copy_soon(peer, target)

    def _count_hot_read(self, answer: Relayed, ahead: list[Peer], target: Target, *, key: str,
                        request_headers: Mapping[str, str], at_once: bool = False) -> None:
        """A non-owner relayed a read of `key`: count it, and once the key is
        hot (HotReads) and an owner answered from its disk, copy the object
        from that owner as a hot copy. Never from the origin: a copy is
        `only-if-cached` at the owner, so a miss there copies nothing.

        An answer that varies is counted and copied per variant: the copy
        holds the one variant the reads select (asked of the owner with the
        fields that select it, as a replica is), and a key read often in one
        variant and once in another should copy the first, not whichever
        variant happened to make the count. Not copied: a variant that cannot
        be spelled as request fields, and an object that cannot fit the hot
        share (it would be fetched whole from the owner only to be dropped).
        """
        if not self.hot.enabled or answer.broken:
            return
        names = vary_names(answer.headers)
        if names is None:
            return  # a Vary no request could match: never stored anywhere
        chosen = variant_of(names, request_headers) if names else ""
        selecting = selecting_headers(names, chosen)
        counted = f"{key}\n{chosen}" if names else key  # HotReads counts per variant
        if not at_once and not self.hot.seen(counted, self._clock()):
            return
        if answer.cache not in _FROM_OWNERS_DISK or counted in self._copying or selecting is None:
            return
        size = _object_size(answer)
        limit = self.settings.hot_capacity
        if size is None or (limit is not None and size > limit) or not self.store.fits(size):
            return
        peer = next((p for p in ahead if p.id == answer.peer), None)
        if peer is None:
            return
        self._copying.add(counted)

        def done() -> None:
            self._copying.discard(counted)
            self.hot.forget(counted)  # a failed copy is tried again only after as many reads again

        self.handoff.copy_hot_soon(peer, target, headers=selecting, done=done)

    def check(self, meta: Meta, *, key: str, request_headers: Mapping[str, str], signed: bool,
              only_if_cached: bool, from_peer: bool) -> HotCheck | None:
        """How to revalidate the hot copy `meta` with its owner for this
        request (hot_revalidation.py); None when it is not: a peer's
        request, a signed read, `only-if-cached`, a node that owns the key
        now (a ring change), a chunked object's manifest (its owner answers
        a peer with the manifest, never a 304), or a copy with no validator
        this request allows."""
        if signed or only_if_cached or from_peer or meta.chunk_size:
            return None
        if any(p.id == self.node_id for p in self.cluster.owners(key)):
            return None
        fields = conditional_fields(etag=meta.etag, last_modified=meta.last_modified,
                                    client_if_none_match=request_headers.get("If-None-Match"))
        if fields is None:
            return None
        return HotCheck(meta=meta, fields=fields, client_if_none_match=request_headers.get("If-None-Match"))

    async def renew(self, meta: Meta, answer: aiohttp.ClientResponse, *, origin: Origin) -> Meta | None:
        """The hot copy `meta` renewed by its owner's 304: the fields the 304
        updates (RFC 9111 §3.2) and the owner's expiry, never later; None
        when the copy went or changed meanwhile, or the 304 made it
        unstorable (it is then dropped)."""
        now = self._clock()
        merged, renewed = renewed_by_304(meta.status, meta.headers, answer.headers.items(), now=now,
                                         policy_ttl=origin.default_ttl, targeted=origin.targeted_cache_control)
        if not renewed.storable:
            await self.drop(meta, why=f"not storable any more: {renewed.reason}")
            return None
        expires_at = owner_expiry(answer.headers.get(EXPIRES_HEADER), fallback=now + renewed.ttl)
        new = await self.store.refresh(meta, headers=merged, stored_at=now, expires_at=expires_at,
                                       age=current_age(answer.headers, now), stale_if_error=renewed.stale_if_error,
                                       stale_while_revalidate=renewed.stale_while_revalidate)
        if new is meta or new.data != meta.data or not new.hot:
            return None
        return new

    async def drop(self, meta: Meta, *, why: str) -> None:
        if await self.store.remove_one(meta, reason="expired" if why == "expired" else None):
            self.counts.gone(meta, self.store.sizes())
            log.info("hot_copy_dropped", key=meta.key, reason=why)


def _object_size(answer: Relayed) -> int | None:
    """The whole object's length from a relayed answer: its Content-Length,
    or a 206's Content-Range total; None when it does not say."""
    if answer.status == 206:
        total = answer.headers.get("Content-Range", "").rpartition("/")[2]
        return int(total) if total.isdigit() else None
    if answer.status == 200:
        return answer.content_length
    return None
