"""The `nezha.io/status` annotation on the cache StatefulSet. Pure: no I/O.

What an operator sees with `kubectl get statefulset nezha-cache -o yaml`:
the ring's epoch and members, the owners per key, the cluster's hit ratio
and which controller leads. It is written on a change, not on every event:
the membership, owners or leader changed, or the hit ratio moved by at
least `HIT_RATIO_STEP` and the last write is `HIT_RATIO_EVERY` seconds old
(traffic moves the ratio all the time; a write per request would be an
API write storm and a watch event for every other watcher).
"""

from __future__ import annotations

import json
from typing import Any

KEY = "nezha.io/status"
HIT_RATIO_STEP = 0.01
HIT_RATIO_EVERY = 30.0


def build(*, epoch: int | None, members: list[str], replicas_per_key: int | None, hit_ratio: float | None,
          leader: str) -> dict[str, Any]:
    return {"epoch": epoch, "members": sorted(members), "replicasPerKey": replicas_per_key,
            "hitRatio": None if hit_ratio is None else round(hit_ratio, 3), "leader": leader}


def should_write(current: str | None, new: dict[str, Any], *, now: float, last_write_at: float | None) -> bool:
    """Whether the annotation (`current`, its JSON text as on the object) needs `new`."""
    try:
        old = json.loads(current) if current else None
    except ValueError:
        return True  # unreadable (edited by hand): put it right
    if not isinstance(old, dict):
        return True
    if any(old.get(k) != new[k] for k in ("epoch", "members", "replicasPerKey", "leader")):
        return True
    before, after = old.get("hitRatio"), new["hitRatio"]
    if before == after:
        return False
    if before is None or after is None or not isinstance(before, (int, float)):
        return True
    return abs(after - before) >= HIT_RATIO_STEP and (last_write_at is None or now - last_write_at >= HIT_RATIO_EVERY)


def render(status: dict[str, Any]) -> str:
    return json.dumps(status, sort_keys=True, separators=(",", ":"))
