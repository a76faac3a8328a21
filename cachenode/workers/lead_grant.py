"""Whether the primary lets a follower lead a small cold fill itself, and the
leads followers hold (docs/cache-node.md, "Followers leading small cold
fills"). Pure.

A follower that leads a fill whose answer turns out not to be one it stores
at once (too large, not cacheable, varying, an error) declines: it drops its
origin connection and hands the client to the primary, which asks the
origin again. That second request is the price of a lead gone wrong, so a
lead is granted only for an origin whose recent fills were small
(cachenode/fill/recent_fills.py): a dataset of large files is granted none
once a fill of it has shown one.

A key a follower leads is in flight for the primary: a request for it that
reaches the primary waits for the follower's outcome. The leads are kept
by key and by follower, so a follower's death releases all of its at once
and those waiting lead themselves.
"""

from __future__ import annotations

from cachenode.fill.recent_fills import RecentFills


def may_grant(recent: RecentFills, origin: str, *, in_flight: bool, stored: bool) -> bool:
    """Whether a follower may lead a cold fill of a key of `origin`: no flight
    of the key under way (the primary's own or another follower's lead),
    nothing stored under it, and the origin's recent fills small."""
    return not in_flight and not stored and recent.small(origin)


class Leads:
    """The keys followers lead, by key and by follower."""

    def __init__(self) -> None:
        self._holder: dict[str, int] = {}
        self._by_worker: dict[int, set[str]] = {}

    def take(self, key: str, worker: int) -> bool:
        """Record `worker`'s lead of `key`; False when someone leads it already."""
        if key in self._holder:
            return False
        self._holder[key] = worker
        self._by_worker.setdefault(worker, set()).add(key)
        return True

    def holder(self, key: str) -> int | None:
        return self._holder.get(key)

    def release(self, key: str, worker: int) -> bool:
        """End `worker`'s lead of `key`; False when it held none (an outcome
        arriving after its lead was released is not obeyed)."""
        if self._holder.get(key) != worker:
            return False
        del self._holder[key]
        keys = self._by_worker[worker]
        keys.discard(key)
        if not keys:
            del self._by_worker[worker]
        return True

    def release_worker(self, worker: int) -> list[str]:
        """End every lead of `worker` (its link closed): the keys it held."""
        keys = sorted(self._by_worker.pop(worker, ()))
        for key in keys:
            del self._holder[key]
        return keys

    def __len__(self) -> int:
        return len(self._holder)
