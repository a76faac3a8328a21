"""The Redis key schema: the one copy in code of every name Nezha keeps in Redis. Pure.

It is a public interface (docs/redis-schema.md): operators read these keys
with `redis-cli`, so a change to a name, a type or a field is made on
purpose and recorded there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

PREFIX = "nezha:"
KEY_EPOCH = "nezha:ring:epoch"  # string: int, INCR on every membership write
KEY_NODES = "nezha:ring:nodes"  # hash: node id -> "host:port"
KEY_WEIGHTS = "nezha:ring:weights"  # hash: node id -> weight
KEY_REPLICAS = "nezha:ring:replicas"  # string: int, owners per key for every node (absent: each node's own)
KEY_LEAVING = "nezha:ring:leaving"  # set: node ids a scale-down took out of the ring; they hand off on SIGTERM
KEY_FENCE = "nezha:ring:leader"  # hash: generation (the Lease's leaseTransitions), holder: who may write the ring
CHANNEL_RING = "nezha:ring:changed"  # pub/sub: message is the new epoch
KEY_CLUSTER_STATS = "nezha:stats:cluster"  # hash: FIELDS
KEY_PINS = "nezha:pins"  # hash: workload "Kind/ns/name" -> JSON {"bytes", "until"} (nezha/index/pins.py)

FIELDS = ("hits", "misses", "peer_hits", "bytes_from_origin", "bytes_served",
          "objects", "bytes_stored", "evictions", "failed_fills")

DRAIN_TTL = 86400  # seconds a node's hand-off record is kept


def hit_ratio(stats: Mapping) -> float | None:
    """(hits + peer_hits) / (hits + peer_hits + misses) of a stats hash; None before any request."""
    served = stats.get("hits", 0) + stats.get("peer_hits", 0)
    total = served + stats.get("misses", 0)
    return served / total if total else None


def key_drain(node_id: str) -> str:
    """hash: how a node's last hand-off on leaving the ring ended (kept a day)."""
    return f"{PREFIX}drain:{node_id}"


def key_node_stats(node_id: str) -> str:
    return f"nezha:stats:node:{node_id}"


def key_host_stats(host: str) -> str:
    return f"nezha:stats:host:{host}"


def key_object(key: str) -> str:
    """Hash of one object: size, stored_at, last_access, and one
    field per node that holds it (`node_field`). One key per object, not three:
    Redis spends most of an entry's bytes on the key itself (docs/redis-schema.md)."""
    return f"nezha:obj:{key}"


NODE_FIELD = "node:"  # an object hash's field per holder: "node:<node id>" -> "1"


def node_field(node_id: str) -> str:
    """The field of an object's hash that says `node_id` holds it."""
    return NODE_FIELD + node_id


def holders(fields: Iterable[str | bytes]) -> set[str]:
    """The node ids an object's hash fields (HKEYS, or HGETALL's keys) name as holding it."""
    found = set()
    for f in fields:
        name = f.decode() if isinstance(f, bytes) else f
        if name.startswith(NODE_FIELD):
            found.add(name[len(NODE_FIELD):])
    return found
