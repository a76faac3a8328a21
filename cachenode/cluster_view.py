"""This node's view of the cluster: who owns a key, and where peers listen.

The view is an immutable `Membership` swapped whole on a change, so request
handlers read it without locks and one request never sees half of an
update. A node with no membership (standalone, or Redis not reached yet)
owns every key.

It sits in the bottom layer (pyproject.toml), below every room that asks
who owns a key: the front, the cluster's copies, chunks (`Members`), and
the store, which asks whether an object it commits is an extra copy here.
"""

from __future__ import annotations

import structlog

from nezha.ring import Membership, Peer

log = structlog.get_logger("nezha.cluster")


class ClusterView:
    def __init__(self, *, node_id: str, replicas: int) -> None:
        self.node_id = node_id
        self.configured_replicas = replicas  # this node's own setting (--replicas)
        self.snapshot = Membership.none()

    @property
    def replicas(self) -> int:
        """Owners per key: what the controller published with the ring, else this node's setting,
        so that every node of a cluster agrees on who owns a key."""
        return self.snapshot.replicas or self.configured_replicas

    def update(self, membership: Membership) -> None:
        """Adopt a membership from the index (or a hand-off request)."""
        adopted = membership.complete()
        # Any difference is adopted, a lower epoch too: Redis may have lost its
        # data and restarted the count. The index filters stale notifications.
        if adopted == self.snapshot:
            return
        self.snapshot = adopted
        log.info("ring_updated", epoch=adopted.epoch, nodes=sorted(adopted.nodes), me=self.node_id,
                 member=self.node_id in adopted.nodes)

    @property
    def clustered(self) -> bool:
        return bool(self.snapshot.nodes)

    def owners(self, key: str, n: int | None = None, *, snapshot: Membership | None = None) -> list[Peer]:
        snap = snapshot or self.snapshot
        if not snap.nodes:
            return []
        ids = snap.ring().owners(key, n or self.replicas)
        return [Peer(i, snap.nodes[i]) for i in ids]

    def holds_as_extra(self, key: str) -> bool:
        """Would a copy of `key` here be an extra copy: another node is its first owner
        (docs/cache-node.md "Eviction"). Alone, or before the ring is known: no."""
        owners = self.owners(key)
        return bool(owners) and owners[0].id != self.node_id

    def peer(self, node_id: str) -> Peer | None:
        addr = self.snapshot.nodes.get(node_id)
        return Peer(node_id, addr) if addr else None
