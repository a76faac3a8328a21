"""What the store's reads of the last hour say: the hit ratio, and the working
set a tier would need (the bytes of the distinct objects read), so that an
operator sees when a dataset outgrew the tier (docs/capacity.md).

Kept per minute (60 buckets), so the figures slide with the clock and cost
O(1) per read. Whether a read is its object's first in the window comes
from the eviction policy's history (`store/policy.py`): the gap since the
object's previous read, in reads of the same kind of copy, is compared with
the reads of that kind in the window. An object whose history was lost is
counted again: the estimate errs towards a larger working set.
"""

from __future__ import annotations

import time
from typing import Callable

_BUCKETS = 60


class _Bucket:
    __slots__ = ("minute", "hits", "misses", "first_bytes", "reads")

    def __init__(self, minute: int) -> None:
        self.minute = minute
        self.hits = 0
        self.misses = 0
        self.first_bytes = 0
        self.reads: dict[str, int] = {}


class Census:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic, window: float = 3600.0) -> None:
        self._clock = clock
        self._width = window / _BUCKETS
        self._buckets: list[_Bucket] = []
        self._reads: dict[str, int] = {}  # reads per kind in the window: the buckets' sum

    def _current(self) -> _Bucket:
        minute = int(self._clock() // self._width)
        buckets = self._buckets
        if not buckets or buckets[-1].minute != minute:
            buckets.append(_Bucket(minute))
            while buckets[0].minute <= minute - _BUCKETS:
                for kind, n in buckets.pop(0).reads.items():
                    self._reads[kind] -= n
        return buckets[-1]

    def read(self, kind: str, size: int, gap: int | None, *, hit: bool) -> None:
        """A read of a stored object (`hit`) or a newcomer's miss; `gap`: reads of
        `kind` since its previous one, as the policy counts them (None: none known)."""
        bucket = self._current()
        in_window = self._reads.get(kind, 0)
        self._reads[kind] = in_window + 1
        bucket.reads[kind] = bucket.reads.get(kind, 0) + 1
        if hit:
            bucket.hits += 1
        else:
            bucket.misses += 1
        if gap is None or gap > in_window:
            bucket.first_bytes += size

    def _live(self) -> list[_Bucket]:
        self._current()
        return self._buckets

    def hit_ratio(self) -> float | None:
        """Hits / reads of the last hour; None without reads."""
        live = self._live()
        hits = sum(b.hits for b in live)
        reads = hits + sum(b.misses for b in live)
        return hits / reads if reads else None

    def working_set(self) -> int:
        """Bytes of the distinct objects read in the last hour (an estimate)."""
        return sum(b.first_bytes for b in self._live())
