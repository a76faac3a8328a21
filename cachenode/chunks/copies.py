"""Chunk copies: handing chunks off when this node leaves the ring, and
dropping the chunks no manifest names any more.

A node leaving the ring has each chunk it holds copied by the chunk's owners
under the new ring (`hand_off`: a HEAD chunk request naming this node as the
source). When an object is invalidated, every node drops its chunks of it
(`drop_chunks`); when a fill from the origin stores a new version of a
chunked object, the old version's chunks are dropped here and on every other
node (`replaced`, told through the invalidation endpoint's `Tell`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, Protocol

import aiohttp
import structlog

from cachenode.chunks.adopted import AdoptedChunks
from cachenode.chunks.fills import ChunkFills
from cachenode.chunks.peers import ChunkPeers, Members
from cachenode.chunks.spec import ChunkSpec, manifest_validator
from cachenode.counts import Counts
from cachenode.fill.parallel import Validator
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.chunks import Layout, chunk_of, place
from nezha.keys import Target, target_of
from nezha.ring import Peer
from nezha.wire import replicate_failed

log = structlog.get_logger("nezha.chunks")


class Tell(Protocol):
    """How every other node is told to drop one version's chunks of a key
    (cachenode/cluster/invalidation.py `Broadcast.tell_old_chunks`)."""

    async def tell_old_chunks(self, key: str, *, chunk_size: int, validator: Validator, why: str) -> None: ...


class ChunkCopies:
    """`me`: this node as its peers reach it (the address a hand-off names as the chunk's source)."""

    def __init__(self, *, me: Peer, store: Store, members: Members, fills: ChunkFills, adopted: AdoptedChunks,
                 peers: ChunkPeers, tell: Tell, counts: Counts, spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]) -> None:
        self.me = me
        self.store = store
        self.members = members
        self.fills = fills
        self.adopted = adopted  # chunks 0 from the first answers of cold fills led here
        self.peers = peers
        self.tell = tell
        self.counts = counts
        self.spawn = spawn

    def spread(self) -> bool:
        """Whether the ring has other nodes to spread a large object's chunks
        over: a node alone stores every object whole, as chunking would gain it nothing."""
        return len(self.members.snapshot.nodes) > 1

    async def hand_off(self, meta: Meta, view: Members) -> list[str]:
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
        etag, last_modified = meta.etag, meta.last_modified
        spec = ChunkSpec(index=index, chunk_size=chunk_size, length=layout.size, source=self.me,
                         validator=Validator(etag=etag, last_modified=None if etag else last_modified))
        return [await self.peers.push(peer, target_of(key), spec) for peer in owners if peer.id != self.me.id]

    async def drop_chunks(self, key: str) -> int:
        """Remove every chunk of the object `key` stored here, whatever its
        chunk size or version: the object was invalidated (a write, the
        invalidation broadcast, a chunk of another version), and its chunks
        would otherwise hold disk until LRU eviction. A chunk fill of it under
        way is let finish (a peer may be reading it as it grows) but what it
        commits is removed. How many chunks went."""
        def of_key(ckey: str, _: Validator) -> bool:
            found = chunk_of(ckey)
            return found is not None and found[0] == key

        self.fills.supersede(of_key)
        removed = 0
        for ckey in self.store.chunks_of(key):
            for meta in await self.store.remove(ckey):
                self.counts.gone(meta, self.store.sizes())
                removed += 1
        if removed:
            log.info("chunks_invalidated", key=key, chunks=removed)
        return removed

    async def drop_version(self, key: str, chunk_size: int, validator: Validator) -> int:
        """Remove the chunks of `key` cut `chunk_size` long of the version
        `validator` names: the key's owner stored another version, so no
        manifest names these any more. Chunks of any other version or size
        stay (the new version's may be filling already). How many went."""
        def of_version(ckey: str, version: Validator) -> bool:
            found = chunk_of(ckey)
            return found is not None and found[:2] == (key, chunk_size) and version == validator

        self.fills.supersede(of_version)
        removed = 0
        for ckey in self.store.chunks_of(key):
            found = chunk_of(ckey)
            meta = self.store.lookup(ckey)
            if found is None or found[1] != chunk_size or meta is None or validator.mismatch(dict(meta.headers)):
                continue
            if await self.store.remove_one(meta):
                self.counts.gone(meta, self.store.sizes())
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

        self.spawn(self.drop_everywhere(old.key, old.chunk_size, validator, why="a new version replaced it"))

    async def adopt(self, meta: Meta, response: aiohttp.ClientResponse, target: Target, *, read_here: bool) -> None:
        """`response`, the origin's 206 of the first chunk of the object whose
        manifest `meta` this node just stored (fill/chunking.py), filled as
        that chunk here and copied by its owners (chunks/adopted.py `AdoptedChunks.adopt`); returns
        once they have asked for their copies. `read_here`: the request that
        led the fill reads the object here (a client's, not a peer's)."""
        await self.adopted.adopt(response, key=meta.key, url=meta.url, target=target,
                               layout=Layout(size=meta.length, chunk_size=meta.chunk_size),
                               validator=manifest_validator(meta), read_here=read_here)

    async def drop_everywhere(self, key: str, chunk_size: int, validator: Validator, *, why: str) -> None:
        """Remove `key`'s chunks cut `chunk_size` long of the version `validator`
        names, here and on every other node of the ring."""
        await self.drop_version(key, chunk_size, validator)
        await self.tell.tell_old_chunks(key, chunk_size=chunk_size, validator=validator, why=why)
