"""Which objects are hot on this node: read often enough, through this node,
that it should keep a copy of its own. Pure: no I/O, the clock is an argument.

A non-owner relays every read of a key to the key's owners, so one object
that a thousand pods read is served from two disks however many nodes the
cluster has. A node that sees `reads` relayed reads of one key within
`window` seconds calls it hot and copies it from an owner
(docs/cache-node.md, "Hot copies").

The rate is a sliding window per key: the times of the key's last `reads`
reads, so the key is hot exactly when the oldest of them lies within
`window` of the newest. Memory is bounded twice over: at most `reads` times
per key, and at most `keys` keys, least recently read dropped first (a key
dropped that way only has to earn its reads again).
"""

from __future__ import annotations

from collections import OrderedDict, deque


class HotReads:
    """`seen(key, now)` after each relayed read; True once the key is hot.

    `reads == 0` turns hot copies off: nothing is ever hot, nothing is kept.
    """

    def __init__(self, *, reads: int, window: float, keys: int = 10_000) -> None:
        if reads < 0:
            raise ValueError(f"reads ({reads}) must be 0 (off) or more")
        if window <= 0:
            raise ValueError(f"window ({window:g}) must be positive")
        if keys < 1:
            raise ValueError(f"keys ({keys}) must be at least 1")
        self.reads = reads
        self.window = window
        self.keys = keys
        self._times: OrderedDict[str, deque[float]] = OrderedDict()  # key -> its last `reads` read times

    @property
    def enabled(self) -> bool:
        return self.reads > 0

    def seen(self, key: str, now: float) -> bool:
        """Count one read of `key` at `now`; whether `key` is now hot."""
        if not self.enabled:
            return False
        times = self._times.get(key)
        if times is None:
            if len(self._times) >= self.keys:
                self._times.popitem(last=False)
            times = self._times[key] = deque(maxlen=self.reads)
        else:
            self._times.move_to_end(key)
        times.append(now)
        return len(times) == self.reads and now - times[0] <= self.window

    def forget(self, key: str) -> None:
        """Start `key`'s count again (its copy was made, or the object was replaced)."""
        self._times.pop(key, None)

    def __len__(self) -> int:
        return len(self._times)
