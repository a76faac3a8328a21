"""A chunk's owners, and the two chunk requests a node makes of them.

Who owns each chunk follows the ring (nezha/chunks.py `place`). A node asks
an owner for part of a chunk (`ChunkPeers.ask`: a peer GET of the object's
URL with CHUNK_HEADER and a Range inside that chunk), or has an owner hold a
chunk too (`ChunkPeers.push`: a HEAD chunk request, answered once the owner
has copied it). Both go through the node's peer client, handed in as a
`Relay`: it marks a peer down and orders owners by who answers.
"""

from __future__ import annotations

from typing import Protocol

import aiohttp
import structlog

from cachenode.chunks.sources import Opened
from cachenode.chunks.spec import ChunkChanged, ChunkSpec, ChunkUnavailable
from cachenode.peers.cuts import asked_why_cut
from nezha.chunks import Layout, Piece, place
from nezha.errors import OriginError
from nezha.keys import Target
from nezha.ring import Membership, Peer
from nezha.wire import (CHUNK_FEEDER_HEADER, CHUNK_HEADER, FILL_FAILED_HEADER, ORIGIN_ERROR_HEADER, ReplicateResult,
                        replicate_failed)

log = structlog.get_logger("nezha.chunks")


class Relay(Protocol):
    """What chunk requests ask of the node's peer client (cachenode/front/relay.py `PeerRelay`)."""

    splice: bool  # peers' bodies may be spliced socket to socket

    async def ask(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                  after: str | None = None) -> aiohttp.ClientResponse:
        """`peer`'s response; OriginError when it could not be had, `peer`
        marked down (its reason `after` and why) if its liveness probe failed too."""

    def mark_down(self, peer: Peer, why: str) -> None: ...

    def own_fields(self, target: Target) -> dict[str, str]:
        """The fields that make a request about `target` this node's own, a peer's."""

    def is_down(self, peer: Peer) -> bool: ...

    def order(self, owners: list[Peer]) -> list[Peer]:
        """`owners`, those marked down last."""


class Members(Protocol):
    """The ring this node sees (cachenode/cluster_view.py `ClusterView`)."""

    snapshot: Membership

    @property
    def replicas(self) -> int: ...

    def owners(self, key: str, n: int | None = None) -> list[Peer]: ...


def owners_of(members: Members, key: str, layout: Layout) -> list[list[Peer]]:
    """The owners of every chunk of `key` under `members`' ring (nezha/chunks.py `place`)."""
    snap = members.snapshot
    if not snap.nodes:
        return [[] for _ in range(layout.count)]
    table = place(snap.ring(), key, layout, members.replicas)
    return [[Peer(n, snap.nodes[n]) for n in ids] for ids in table]


class ChunkPeers:
    """This node's chunk requests to other nodes."""

    def __init__(self, *, node_id: str, relay: Relay) -> None:
        self.node_id = node_id
        self.relay = relay

    def _fields(self, target: Target, spec: ChunkSpec) -> dict[str, str]:
        """A chunk request's fields: this node's own, as a peer (peers/asks.py `own_fields`), and the chunk."""
        return {**self.relay.own_fields(target), CHUNK_HEADER: spec.header()}

    async def ask(self, peer: Peer, target: Target, spec: ChunkSpec, piece: Piece) -> Opened | Peer | None:
        """`peer`'s answer for `piece`; None when it cannot be used and the next source should be tried.
        A Peer: for a chunk passed on (`spec.role` "pass"), the node of the chunk's wave to read it from
        (chunks/feeders.py)."""
        headers = {**self._fields(target, spec), "Range": f"bytes={piece.offset}-{piece.offset + piece.length - 1}"}
        try:
            r = await self.relay.ask(peer, "GET", peer.url + target.path_qs, headers=headers)
        except OriginError:  # marked down by `ask` when its liveness probe failed too
            return None
        source = f"peer {peer.id} (chunk {spec.index})"
        if r.status == 421 and CHUNK_FEEDER_HEADER in r.headers and spec.role == "pass":
            feeder = r.headers[CHUNK_FEEDER_HEADER]
            r.release()
            node, _, address = feeder.partition(" ")
            return Peer(node, address) if node and address else None
        if r.status == 404 and spec.role == "fed":  # its flight of the chunk ended: the asker goes back to the owner
            r.release()
            log.info("chunk_not_fed", peer=peer.id, index=spec.index)
            return None
        if r.status == 412:
            why = (await r.text())[:300].strip()
            r.release()
            raise ChunkChanged(f"{source}: {why}")
        if r.status >= 500 and ORIGIN_ERROR_HEADER in r.headers:
            why = r.headers[ORIGIN_ERROR_HEADER]
            r.release()
            raise ChunkUnavailable(f"{source}: the origin failed: {why}")
        if r.status not in (200, 206) or r.content_length != piece.length:
            failed = r.headers.get(FILL_FAILED_HEADER)
            log.warning("chunk_peer_refused", peer=peer.id, status=r.status, length=r.content_length,
                        wanted=piece.length, fill_failed=failed)
            r.release()
            if r.status >= 500 and failed is None:
                self.relay.mark_down(peer, f"answered {r.status} for a chunk")
            return None
        return Opened(piece, response=r, source=source, peer=peer)

    async def broke_off(self, peer: Peer, target: Target, spec: ChunkSpec, why: str) -> bool:
        """`peer`'s answer for chunk `spec` broke off mid-body (`why`): asked
        whether it cut the answer because its own fill failed (True). Marked
        down unless it answers so: a peer that does not answer, or broke off
        for another reason, is routed around as any peer that breaks off."""
        headers = self._fields(target, spec)
        failed = await asked_why_cut(self.relay, peer, peer.url + target.path_qs, headers=headers, why=why)
        if failed is None:
            return False
        log.info("chunk_peer_fill_failed", peer=peer.id, index=spec.index, reason=failed, broke=why)
        return True

    async def push(self, peer: Peer, target: Target, spec: ChunkSpec) -> str:
        """Have `peer`, an owner of the chunk behind this node, hold it too:
        a HEAD chunk request, which it answers once it has copied the chunk
        (from this node, the owner ahead of it). A failure only logs: the
        chunk stays on this node, and `peer` fills it at its next read."""
        headers = self._fields(target, spec)
        try:
            r = await self.relay.ask(peer, "HEAD", peer.url + target.path_qs, headers=headers)
        except OriginError as e:
            log.warning("chunk_replica_failed", peer=peer.id, index=spec.index, error=str(e))
            return replicate_failed(e)
        r.release()
        if r.status != 200:
            log.warning("chunk_replica_failed", peer=peer.id, index=spec.index, status=r.status)
            return replicate_failed(f"{peer.id} answered {r.status}")
        return ReplicateResult.COPIED
