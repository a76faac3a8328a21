"""Which byte ranges of a large object each parallel stream fetches next. Pure.

A parallel fill cuts the object into slices and hands them out front first,
so the contiguous prefix that clients stream from grows at the aggregate rate
rather than at one stream's. When no slice is left unclaimed, an idle stream
takes the back half of the in-progress slice with the most bytes still to
come (work stealing): one slow connection cannot hold up the end of the
object. A slice is only ever cut, never handed to two streams, so each byte
is fetched once. Only a slow tail is stolen (`steal_after`): a slice that
will end within that time on its own is left to it, since the cut costs a
request and every byte the origin already put in flight on the victim's
connection, which is closed at the cut.

On demand (an origin's `fill_on_range` off, and a client asking for a
range): only slices some client waits for are handed out, and the rest of
the object is never fetched unless a client asks for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(eq=False)
class Slice:
    start: int
    end: int  # exclusive; lowered when another stream steals the back of it
    pos: int  # the next byte to arrive
    began: float = 0.0  # when a stream took it
    took: int = field(default=-1)  # pos then

    def eta(self, now: float) -> float:
        """Seconds until the slice ends at the rate it has been arriving (inf if none has)."""
        arrived, spent = self.pos - self.took, now - self.began
        if self.took < 0 or arrived <= 0 or spent <= 0:
            return float("inf")
        return self.remaining * spent / arrived

    @property
    def remaining(self) -> int:
        return max(0, self.end - self.pos)

    @property
    def done(self) -> bool:
        return self.pos >= self.end


class Plan:
    def __init__(self, total: int, slice_size: int, *, min_steal: int = 1 << 20, on_demand: bool = False,
                 steal_after: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        if total <= 0 or slice_size <= 0:
            raise ValueError(f"total ({total}) and slice_size ({slice_size}) must be positive")
        self.total = total
        self.min_steal = min_steal
        self.on_demand = on_demand
        self.steal_after = steal_after
        self.clock = clock
        self.slices = [Slice(s, min(s + slice_size, total), s) for s in range(0, total, slice_size)]
        self._claimed: set[int] = set()  # ids of slices handed to a stream
        self._front = 0  # index of the first slice not done: the prefix ends in it
        self._wanted: list[tuple[int, int]] = []  # byte ranges clients wait for, beyond the prefix

    def claim_first(self) -> Slice:
        """Slice 0, for the stream that is already reading the object from its start."""
        return self._claim(self.slices[0])

    def _claim(self, s: Slice) -> Slice:
        self._claimed.add(id(s))
        s.began, s.took = self.clock(), s.pos
        return s

    def want(self, first: int, end: int) -> None:
        """A client waits for bytes [first, end): the slices holding them go first."""
        if any(a <= first and end <= b for a, b in self._wanted):
            return  # asked already (a reader asks again at each wait)
        self._wanted.append((first, end))

    def wants(self, offset: int) -> bool:
        """Some client waits for byte `offset`."""
        return any(first <= offset < end for first, end in self._wanted)

    def has_unclaimed_wanted(self) -> bool:
        """Some client waits for bytes of a slice no stream has taken yet."""
        return any(s.start < end and first < s.end and id(s) not in self._claimed
                   for first, end in self._wanted for s in self.slices[self._front:])

    def may_steal_later(self) -> bool:
        """A slice in progress is long enough to steal from, if it proves slow."""
        return any(not s.done and id(s) in self._claimed and s.remaining >= 2 * self.min_steal
                   for s in self.slices[self._front:])

    def on_disk(self) -> int:
        """Bytes of the object on disk, wherever they are."""
        return sum(s.pos - s.start for s in self.slices)

    def next_wanted(self) -> Slice | None:
        """An unclaimed slice holding bytes a client waits for, or None."""
        self._wanted = [(first, end) for first, end in self._wanted if self.covered_until(first) < end]
        for first, end in self._wanted:
            for s in self.slices[self._front:]:
                if s.start < end and first < s.end and id(s) not in self._claimed:
                    return self._claim(s)
        return None

    def next(self) -> Slice | None:
        """The work for a stream that is free: an unclaimed slice a client waits
        for, else the first unclaimed slice (unless on demand), else a stolen
        back half of the slowest, else None (the stream may stop)."""
        wanted = self.next_wanted()
        if wanted is not None:
            return wanted
        if not self.on_demand:
            for s in self.slices[self._front:]:
                if id(s) not in self._claimed:
                    return self._claim(s)
        return self._steal()

    def covered_until(self, offset: int) -> int:
        """Where the bytes on disk from `offset` on stop being contiguous (`offset` if it is not on disk)."""
        if offset < self.prefix:
            return self.prefix
        reach = offset
        for s in self.slices[self._front:]:
            if s.end <= reach:
                continue
            if s.start > reach or s.pos <= reach:
                break
            reach = s.pos
            if not s.done:
                break
        return reach

    def _steal(self) -> Slice | None:
        now = self.clock()
        busy = [s for s in self.slices[self._front:] if not s.done and id(s) in self._claimed
                and s.remaining >= 2 * self.min_steal
                and (self.steal_after <= 0 or (s.eta(now) > self.steal_after and now - s.began > self.steal_after))]
        if not busy:
            return None
        victim = max(busy, key=lambda s: s.remaining)
        mid = victim.pos + victim.remaining // 2
        taken = Slice(mid, victim.end, mid)
        victim.end = mid
        self.slices.insert(self.slices.index(victim) + 1, taken)
        return self._claim(taken)

    def advance(self, s: Slice, n: int) -> None:
        """`n` more bytes of `s` are on disk."""
        if n < 0 or s.pos + n > s.end:
            raise ValueError(f"advance by {n} past the end of slice {s.start}-{s.end} at {s.pos}")
        s.pos += n
        while self._front < len(self.slices) and self.slices[self._front].done:
            self._front += 1

    @property
    def prefix(self) -> int:
        """Bytes from the start that are all on disk."""
        if self._front >= len(self.slices):
            return self.total
        return self.slices[self._front].pos

    @property
    def complete(self) -> bool:
        return self.prefix >= self.total
