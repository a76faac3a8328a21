"""This node's view of the cluster: who owns a key, and where peers listen.

The view is an immutable snapshot swapped whole on a membership change, so
request handlers read it without locks and one request never sees half of
an update. A node with no membership (standalone, or Redis not reached yet)
owns every key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from cachenode.ring import Ring

log = structlog.get_logger("nezha.cluster")


@dataclass(frozen=True)
class Peer:
    id: str
    address: str  # host:port

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@dataclass(frozen=True)
class Snapshot:
    epoch: int | None
    ring: Ring | None
    addresses: dict[str, str] = field(default_factory=dict)
    replicas: int | None = None  # owners per key published with the ring, if any
    leaving: frozenset[str] = frozenset()  # nodes a scale-down took out: they hand off before exiting


class ClusterView:
    def __init__(self, *, node_id: str, replicas: int, vnodes: int = 160) -> None:
        self.node_id = node_id
        self.configured_replicas = replicas  # this node's own setting (--replicas)
        self.vnodes = vnodes
        self.snapshot = Snapshot(epoch=None, ring=None)

    @property
    def replicas(self) -> int:
        """Owners per key: what the controller published with the ring, else this node's setting,
        so that every node of a cluster agrees on who owns a key."""
        return self.snapshot.replicas or self.configured_replicas

    def update(self, membership) -> None:
        """Adopt a `Membership` (epoch, nodes id->address, weights) from the index."""
        weights = {n: (membership.weights or {}).get(n, 1) for n in membership.nodes}
        snap = self.snapshot
        published = getattr(membership, "replicas", None)
        leaving = frozenset(getattr(membership, "leaving", ()) or ())
        if (membership.epoch == snap.epoch and dict(membership.nodes) == snap.addresses
                and weights == (dict(snap.ring.nodes) if snap.ring else {}) and published == snap.replicas
                and leaving == snap.leaving):
            return
        # Any difference is adopted, a lower epoch too: Redis may have lost its
        # data and restarted the count. The index filters stale notifications.
        ring = Ring(weights, vnodes=self.vnodes) if weights else None
        self.snapshot = Snapshot(epoch=membership.epoch, ring=ring, addresses=dict(membership.nodes),
                                 replicas=published, leaving=leaving)
        log.info("ring_updated", epoch=membership.epoch, nodes=sorted(membership.nodes), me=self.node_id,
                 member=self.node_id in membership.nodes)

    @property
    def clustered(self) -> bool:
        return self.snapshot.ring is not None

    def owners(self, key: str, n: int | None = None, *, snapshot: Snapshot | None = None) -> list[Peer]:
        snap = snapshot or self.snapshot
        if snap.ring is None:
            return []
        ids = snap.ring.owners(key, n or self.replicas)
        return [Peer(i, snap.addresses[i]) for i in ids if i in snap.addresses]

    def peer(self, node_id: str) -> Peer | None:
        addr = self.snapshot.addresses.get(node_id)
        return Peer(node_id, addr) if addr else None
