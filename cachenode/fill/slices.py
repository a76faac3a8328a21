"""Which slice of a large object each parallel stream fetches next. Pure.

A parallel fill cuts the object into fixed slices and hands them out front
first, from one queue that every stream takes from, so the contiguous
prefix that clients stream from grows at the aggregate rate rather than at
one stream's. A slice is fetched by one range request, asked for exactly
and read to its end: never cut, never handed to two streams. So each byte
is fetched once, and no answer is closed with the origin's bytes still in flight on
it. (Stealing the back half of a slow slice made the origin send 4-13% more
than the object, the bytes in flight on every cut; a slow stream now holds
up the end by at most one slice.)

On demand (an origin's `fill_on_range` off, and a client asking for a
range): only slices some client waits for are handed out, and the rest of
the object is never fetched unless a client asks for it.

A fill led by a resume (a client, or a peer relaying one, asking for the
rest of a body its first source broke off: `Range: bytes=a-` under
If-Range) has its first answer already: the origin's 206 for [a, b]. That
span is one slice, claimed from the start by the answer in hand, and the
object's other bytes are cut into slices around it; so the resume costs
one origin request however many clients wait on it, and the rest of the
object (the head the dead leader took with it) is fetched once beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(eq=False)
class Slice:
    start: int
    end: int  # exclusive
    pos: int  # the next byte to arrive

    @property
    def remaining(self) -> int:
        return max(0, self.end - self.pos)

    @property
    def done(self) -> bool:
        return self.pos >= self.end


class Plan:
    def __init__(self, total: int, slice_size: int, *, on_demand: bool = False,
                 answered: tuple[int, int] | None = None) -> None:
        """`answered`: bytes [first, end) that an answer in hand brings (a resume's
        206), one slice claimed from the start (`answered_slice`)."""
        if total <= 0 or slice_size <= 0:
            raise ValueError(f"total ({total}) and slice_size ({slice_size}) must be positive")
        self.total = total
        self.on_demand = on_demand
        self._claimed: set[int] = set()  # ids of slices handed to a stream
        self.answered_slice: Slice | None = None
        if answered is None:
            self.slices = _cut(0, total, slice_size)
        else:
            first, end = answered
            if not 0 <= first < end <= total:
                raise ValueError(f"answered bytes {first}-{end} are not inside an object of {total}")
            self.answered_slice = self._claim(Slice(first, end, first))
            self.slices = [*_cut(0, first, slice_size), self.answered_slice, *_cut(end, total, slice_size)]
        self._front = 0  # index of the first slice not done: the prefix ends in it
        self._wanted: list[tuple[int, int]] = []  # byte ranges clients wait for, beyond the prefix

    def _claim(self, s: Slice) -> Slice:
        self._claimed.add(id(s))
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
        for, else the first unclaimed slice (unless on demand), else None (the
        stream may stop: every slice is taken)."""
        wanted = self.next_wanted()
        if wanted is not None:
            return wanted
        if not self.on_demand:
            for s in self.slices[self._front:]:
                if id(s) not in self._claimed:
                    return self._claim(s)
        return None

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


def _cut(start: int, end: int, slice_size: int) -> list[Slice]:
    """Bytes [start, end) as slices of `slice_size`, the last one shorter."""
    return [Slice(s, min(s + slice_size, end), s) for s in range(start, end, slice_size)]


class Ranges(Protocol):
    """A parallel fetch writing a fill's body in slices, as the fill's readers
    see it (cachenode/fill/parallel.py `RangedFetch`; cachenode/fill/buffer.py)."""

    on_demand: bool  # only the ranges readers ask for are fetched

    def covered_until(self, offset: int) -> int:
        """Where the run of bytes on disk from `offset` ends."""

    def want(self, first: int, end: int) -> None:
        """A reader waits for bytes [first, end): fetch their slices first."""
