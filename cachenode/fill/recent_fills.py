"""Each origin's last fills, small or not: how the primary tells an
origin of small objects from one of large ones (cachenode/workers/lead_grant.py,
which grants followers the lead of a small cold fill only for the first).

An origin is small once a fill of it was seen and at most one in `WINDOW`
of its fills were not small (none until `WINDOW` were seen): a lead
granted for an origin of large objects would be declined and its object
asked of the origin twice. An origin not seen yet is the desk's to probe
(cachenode/workers/lead_desk.py).

Kept by the primary's fast misses (front/fast_misses.py), which lead nearly
every cold fill of a plain read, and by the primary's desk of followers'
leads (cachenode/workers/lead_desk.py). Pure.
"""

from __future__ import annotations

from collections import deque

WINDOW = 32  # an origin's last fills remembered
NOT_SMALL_MAX = 1  # fills in the window not small, at most


class RecentFills:
    """Each origin's last `WINDOW` fills: small (a 200 of at most the store's
    small objects' size, stored whole and not varying: what a follower's lead
    stores) or not."""

    def __init__(self, *, window: int = WINDOW) -> None:
        self._window = window
        self._fills: dict[str, deque[bool]] = {}
        self._not_small: dict[str, int] = {}

    def record(self, origin: str, *, small: bool) -> None:
        fills = self._fills.get(origin)
        if fills is None:
            fills = self._fills[origin] = deque(maxlen=self._window)
            self._not_small[origin] = 0
        if len(fills) == self._window and not fills[0]:
            self._not_small[origin] -= 1
        fills.append(small)
        if not small:
            self._not_small[origin] += 1

    def seen(self, origin: str) -> bool:
        return origin in self._fills

    def small(self, origin: str, *, not_small_max: int = NOT_SMALL_MAX) -> bool:
        """Whether `origin`'s recent fills were small: seen, and at most
        `not_small_max` of its last `WINDOW` not small (none while fewer were seen)."""
        fills = self._fills.get(origin)
        return fills is not None and self._not_small[origin] * self._window <= not_small_max * len(fills)
