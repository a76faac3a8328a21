"""Chunk 0 from a cold fill's first answer: stored where it landed, copied by its owners.

A cold fill of a chunked object asks the origin for the first chunk's range
(fill/chunking.py), so the answer that tells the object's size is chunk 0,
stored here as it comes rather than closed unread (`AdoptedChunks.adopt`).
Whoever owns the chunk, it is filled here as any chunk fill is, on the same
flights (chunks/fills.py `ChunkFills.lead`, `run`, `store_chunk`): its first
other owner copies it from here as it grows, before any reader learns of
the manifest, and the owners behind that one copy it from there. The copy
of a node that owns none of the chunk goes once they hold it and the reads
of its object here have passed it (chunks/kept.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, Callable, Coroutine

import aiohttp
import structlog

from cachenode.chunks.fills import ChunkFill, ChunkFills
from cachenode.chunks.kept import Kept, KeptChunks
from cachenode.chunks.peers import ChunkPeers, Members, owners_of
from cachenode.chunks.spec import ChunkSpec
from cachenode.counts import Counts
from cachenode.fill.flights import Flight
from cachenode.fill.parallel import Validator
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.chunks import Layout, chunk_key
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import ReplicateResult

log = structlog.get_logger("nezha.chunks")

# How long an adopted chunk 0 (`AdoptedChunks.adopt`) waits for its first owner to ask for its copy before
# its manifest is answered: a round trip or two on a live ring.
ADOPT_WAIT = 1.0


class AdoptedChunks:
    """This node's chunks 0 from the first answers of the cold fills it led,
    and those of them it owns none of, kept for the reads here (`kept`)."""

    def __init__(self, *, node_id: str, fills: ChunkFills, store: Store, members: Members, peers: ChunkPeers,
                 counts: Counts, spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]) -> None:
        self.node_id = node_id
        self.fills = fills
        self.store = store
        self.members = members
        self.peers = peers
        self.counts = counts
        self.spawn = spawn  # background work the node waits for (settled) and cancels (stop)
        self.kept = KeptChunks()  # adopted chunks 0 this node owns none of, kept for the reads here

    async def adopt(self, response: aiohttp.ClientResponse, *, key: str, url: str, target: Target, layout: Layout,
                    validator: Validator, read_here: bool) -> None:
        """Chunk 0 of `key` from `response`: the origin's 206 to the first
        request of the object's cold fill, which asked for the first chunk's
        range (fill/chunking.py), so that the answer that told the object's
        size is stored, not closed unread. Filled here as a chunk fill is,
        whoever owns it: its first other owner is asked at once to copy it
        from this node as it grows, the owners behind that one to copy it
        from there once it holds it (this node's link sends one copy), and a
        copy here that no owner's place names goes then, once the reads here
        from now on have passed it, the leading request's first when it is
        `read_here` (chunks/kept.py). Returns once the
        first has asked (at most ADOPT_WAIT): a reader told of the manifest
        after that finds its copy under way, where it would otherwise fill
        chunk 0 from the origin."""
        address = self.members.snapshot.nodes.get(self.node_id)  # as the ring names this node to its peers
        led = self.fills.lead(chunk_key(key, 0, layout.chunk_size), validator)
        if led is None:  # a fill of it runs here already (a peer's read came first): that one is its fill
            response.release()
            return
        flight, fill = led
        owners = owners_of(self.members, key, layout)[0]
        others = [p for p in owners if p.id != self.node_id] if address is not None else []
        spec = ChunkSpec(index=0, chunk_size=layout.chunk_size, length=layout.size, validator=validator,
                         source=Peer(self.node_id, address) if address is not None else None)
        first = self.spawn(self.peers.push(others[0], target, spec)) if others else None
        task = self.fills.run(flight, self._adopted(flight, fill, response, url=url, target=target, layout=layout))
        if first is not None:
            drop = self.kept.keep(flight.key, read_here=read_here) if len(others) == len(owners) else None
            self.spawn(self._copied_behind(task, first, others, target, spec, drop=drop))
        deadline = time.monotonic() + ADOPT_WAIT
        while first is not None and not fill.joined and not first.done() and time.monotonic() < deadline:
            fill.join_seen.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fill.join_seen.wait(), timeout=0.05)

    async def _adopted(self, flight: Flight, fill: ChunkFill, response: aiohttp.ClientResponse, *, url: str,
                       target: Target, layout: Layout) -> Meta:
        """Store chunk 0 from the first answer (`adopt`)."""
        started, size = time.monotonic(), layout.length_of(0)
        stored = await self.fills.store_chunk(fill, flight.key, response, source=f"origin {url}", url=url,
                                              host=target.host, size=size, length=layout.size)
        log.info("chunk_filled", key=flight.key, bytes=size, source="origin", first_answer=True,
                 seconds=round(time.monotonic() - started, 3))
        return stored

    async def _copied_behind(self, adopted: asyncio.Task, first: asyncio.Task, others: list[Peer], target: Target,
                             spec: ChunkSpec, *, drop: Kept | None) -> None:
        """Once the first other owner of an adopted chunk holds it, have the
        owners behind it copy it from there (from here, if it could not);
        then, `drop`: this node owns none of the chunk, its copy goes once
        the reads here passed it (kept when no owner could copy it: then
        it is the only one)."""
        copied = (await asyncio.gather(first, return_exceptions=True))[0] == ReplicateResult.COPIED
        source = others[0] if copied else spec.source
        behind = [await self.peers.push(p, target, dataclasses.replace(spec, source=source)) for p in others[1:]]
        stored = (await asyncio.gather(adopted, return_exceptions=True))[0]  # an error: nothing stored here
        if drop is not None and isinstance(stored, Meta) and (copied or ReplicateResult.COPIED in behind):
            read = await self.kept.read(drop)
            if await self.store.remove_one(stored):
                self.counts.gone(stored, self.store.sizes())
                log.info("chunk_dropped", key=stored.key, reason="its owners hold it", reads_through=read)
        if drop is not None:
            self.kept.release(drop)
