"""Which stored object goes first when room is needed, and whether a newcomer
may take the room of one that is stored: pure, no I/O, O(1) per event.

Training reads a dataset epoch after epoch. Once the dataset is larger than
the cache, least-recently-used eviction throws out exactly what the next
epoch reads first: in sequential epochs every read misses, in shuffled ones
most do. What wins there is a fixed subset (CoorDL): keep what is stored,
and a hit ratio of capacity / dataset follows from the second epoch on. A
cache that never lets go, though, never follows a team to its next dataset,
and does worse than LRU on skewed (Zipf) traffic. The rules below keep the
subset while the stored objects are still read, and let go when they are
not (docs/cache-node.md "Eviction" weighs the policies and shows the
simulation; tests/unit/cachenode/store/test_policy.py is that simulation).

Time is counted in accesses (hits and misses this node's store sees). The
resident objects are kept in least-recently-used order; the head is the
victim. A newcomer that missed (`missed`) displaces the victim only when:

1. it was read more often than the victim (a frequency sketch, halved every
   `halving` accesses: TinyLFU's admission, which is what beats LRU on Zipf);
   in an epoch scan every object is read once per epoch, so nothing is more
   frequent and the subset stays; or
2. it came back within as many accesses as the cache holds objects (an LRU
   of this size would have hit it: the sign of a working set that fits),
   and the victim has been idle longer than the newcomer's own gap and
   longer than every gap between two reads of a stored object seen in the
   last `window` accesses: nothing stored is read that way any more. After
   a switch to a new dataset, its objects come back within an epoch while
   the old ones are never read again, so the new one is stored during its
   second epoch.

The decision is the store's to take when the newcomer is committed
(cachenode/store/index.py): evicting for a fill's reservation, before the
newcomer is known, would give up the subset one object per miss, LRU
again, so reservations evict only beyond a headroom.

The history of objects not stored (their last access and frequency) is a
table indexed by a hash of the slot (two-way), of four entries per stored
object (11 bytes each). An entry holds one object's history at a time,
tagged with more bits of its hash: an object whose entries others took
has no history, so a collision can only keep a newcomer out (the subset
stays), never let one in on another's record. Memory per object stays fixed.

When the stored objects pass a quarter of the table, a table twice the size
takes over. Rebuilt whole, it stalled the one add that crossed the line
(0.45 s at 262,144 objects, 1.8 s at a million); instead the stored objects'
histories move over a few at a time (`_STEP` per add, hit and miss, as Redis
rehashes its dict), the old table kept beside the new one until a walk over
the order ends, and the adds that lead to a growth make the new table's
entries empty beforehand (`_Spare`). Meanwhile a history missing from the
new table is read from the old one, and a stored object not moved yet reads
as the whole rebuild began it (its last access, a count of 1, halved since).
Two things differ from that rebuild: a stored object keeps its history (its
count was reset to 1), and the history of an object not stored stays
readable until the walk ends (it was dropped at once). An object stored by
the growth's own access, without a read (the start-up scan adds many in
one), counts as stored at the growth.
"""

from __future__ import annotations

import mmap
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, Protocol

_HALVE = bytes(v >> 1 for v in range(256))  # a counter halved: bytearray.translate's table
_NEVER = -1
_MAX_COUNT = 15
_NEVERS = memoryview(array("q", [_NEVER]) * 4096)
# Stored objects whose history moves to a grown table per add, hit and miss. A walk
# ends before the next growth: it takes at most (2*N + 2*_STEP) / (_STEP - 1) steps
# for N objects stored at the growth (Order.walk), and the next growth needs N - 1 adds
# more, each a step (8: from N = 5, a table of 16, on; a table starts at 1024).
_STEP = 8


@dataclass(frozen=True)
class Candidate:
    """A newcomer as the policy saw it when it missed: how often, and how long ago, it was read before."""

    slot: Hashable  # as the order names it: a slot, or (the store's index) its hash
    count: int  # reads counted before this one
    gap: int | None  # accesses since its previous read; None: none remembered
    at: int = 0  # the access this read is (a victim's idle time is counted up to it)


class _History:
    """Last access and a read count per hashed slot, for objects stored or not.

    Two-way: a slot's history may sit in either of two entries its hash
    names, and a newcomer takes the one read longer ago, so two objects
    that share one entry still both keep theirs.
    """

    def __init__(self, size: int, hash_fn: Callable[[str], int], old: _History | None = None,
                 spare: _Spare | None = None) -> None:
        self._hash = hash_fn
        self.old = old  # the table this one replaced, while the stored objects' histories move over
        self.size = size
        self._mask = size - 1
        self._bits = size.bit_length() - 1
        if spare is None or spare.size != size:
            spare = _Spare(size)
        spare.fill(1)  # its entries made empty before, by the adds that led to this growth
        self.last = spare.last
        self.counts = bytearray(size)
        self.tags = spare.tags  # 16 more bits of the hash: whose history an entry holds

    def _find(self, slot: str) -> tuple[int, int, int]:
        """(the entry holding `slot`'s history or -1, the entry a newcomer would take, the tag).
        Its two entries and tag are bits of its hash (asked on every read: no call of its own)."""
        h = self._hash(slot) & 0xFFFFFFFFFFFFFFFF
        mask, tags, last = self._mask, self.tags, self.last
        a, b, tag = h & mask, (h >> 40) & mask, (h >> 24) & 0xFFFF
        if tags[a] == tag and last[a] != _NEVER:
            return a, a, tag
        if tags[b] == tag and last[b] != _NEVER:
            return b, b, tag
        return -1, (a if last[a] <= last[b] else b), tag

    def read(self, slot: str) -> tuple[int, int]:
        """(last access, count) of `slot`; (_NEVER, 0) when no entry holds its history."""
        i, _, _ = self._find(slot)
        if i < 0:
            return (_NEVER, 0) if self.old is None else self.old.read(slot)
        return self.last[i], self.counts[i]

    def write(self, slot: str, now: int) -> tuple[int, int]:
        """A read of `slot` at `now` recorded; what `read` gave before it (one look-up for both)."""
        i, free, tag = self._find(slot)
        if i < 0:  # the entry read longer ago gives way; a history still in the old table goes on
            before = (_NEVER, 0) if self.old is None else self.old.read(slot)
            i = free
            self.tags[i], self.counts[i] = tag, before[1]
        else:
            before = self.last[i], self.counts[i]
        self.last[i] = now
        if self.counts[i] < _MAX_COUNT:
            self.counts[i] += 1
        return before

    def adopt(self, slot: str, last: int, count: int) -> int:
        """Stored `slot`'s history into this table from the old one, or (`last`, `count`)
        when the old has none (what the whole rebuild wrote): nothing when this one
        holds it already (read or moved since the growth). 1 if an entry was written."""
        i, free, tag = self._find(slot)
        if i >= 0:
            return 0
        old = self.old
        j, _, _ = old._find(slot)
        if j >= 0:
            last, count = old.last[j], old.counts[j]
        self.tags[free], self.last[free], self.counts[free] = tag, last, count
        return 1

    def halve(self) -> None:
        self.counts = self.counts.translate(_HALVE)
        if self.old is not None:
            self.old.halve()


class _Spare:
    """The last accesses and tags of the next, larger history table, made empty a
    few entries per add as the objects stored near its growth: an array made in
    the add that grows the table would cost that add time in proportion to the
    objects (50 ms at a million, mostly writing _NEVER), and one grown by appends
    would now and then be copied whole. An anonymous map's pages are zeros
    untouched until written, so the memory grows with what is made empty."""

    def __init__(self, size: int) -> None:
        self.size = size
        # Private: a process forked from this one keeps its own copy, as of an array.
        self.last = memoryview(mmap.mmap(-1, 8 * size, flags=mmap.MAP_PRIVATE)).cast("q")
        self.tags = memoryview(mmap.mmap(-1, 2 * size, flags=mmap.MAP_PRIVATE)).cast("H")
        self._empty = 0  # entries of `last` made _NEVER so far

    def fill(self, adds: int) -> None:
        """An equal share of the entries not made empty yet, for each of `adds` adds left before the growth."""
        empty, size = self._empty, self.size
        end = empty + -(-(size - empty) // max(1, adds))
        while empty < end:
            step = min(end - empty, len(_NEVERS))
            self.last[empty:empty + step] = _NEVERS[:step]
            empty += step
        self._empty = empty


class Order(Protocol):
    """The stored objects in least-recently-used order, with their last access.

    `KeyOrder` (an OrderedDict) for any hashable names; the store's index
    passes its own over compact rows (cachenode/store/rows.py `RowOrder`)."""

    def __len__(self) -> int: ...

    def __contains__(self, slot: Hashable) -> bool: ...

    def __iter__(self) -> Iterator: ...

    def get(self, slot: Hashable) -> int | None: ...

    def put(self, slot: Hashable, now: int) -> None: ...

    def pop(self, slot: Hashable) -> None: ...

    def items(self) -> Iterator[tuple[Hashable, int]]: ...

    def walk(self, count: int) -> Iterator[list[tuple[Hashable, int]]]:
        """The objects stored now, in batches of at most `count` (slot, last access),
        each batch made when asked, of objects still stored then: resumable while
        the order changes between batches. An object stored throughout is met once;
        one added meanwhile may be met or not. For N objects stored at the start and
        A added meanwhile, at most ceil(N / `count`) + (N + A) / `count` batches."""
        ...


class KeyOrder:
    """An `Order` over any hashable names: slot -> last access, least recent first."""

    def __init__(self) -> None:
        self._d: OrderedDict[Hashable, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, slot: Hashable) -> bool:
        return slot in self._d

    def __iter__(self) -> Iterator:
        return iter(self._d)

    def get(self, slot: Hashable) -> int | None:
        return self._d.get(slot)

    def put(self, slot: Hashable, now: int) -> None:
        self._d[slot] = now
        self._d.move_to_end(slot)

    def pop(self, slot: Hashable) -> None:
        self._d.pop(slot, None)

    def items(self) -> Iterator[tuple[Hashable, int]]:
        return iter(self._d.items())

    def walk(self, count: int) -> Iterator[list[tuple[Hashable, int]]]:
        """`Order.walk` over a copy of the names stored at the start (an OrderedDict
        cannot be iterated while it changes): ceil(N / `count`) batches."""
        keys, d = list(self._d), self._d
        for at in range(0, len(keys), count):
            yield [(k, d[k]) for k in keys[at:at + count] if k in d]


class Policy:
    """The eviction order of one class of stored objects, and the admission test for newcomers.

    `window` and `halving` are shares of the number of objects stored: the
    horizon of the recent hits rule 2 compares with, and the period after
    which read counts are halved. `order`: where the order is kept (a
    `KeyOrder` unless given); `hash_fn` hashes a slot for the history.
    """

    def __init__(self, *, hash_fn: Callable[[str], int] = hash, window: float = 0.5, halving: float = 2.0, margin: float = 1.25,
                 min_history: int = 1024, order: Order | None = None) -> None:
        self._hash = hash_fn
        self._window = window
        self._margin = margin
        self._halving = halving
        self._min_history = min_history
        self._order: Order = order if order is not None else KeyOrder()  # stored slot -> last access; least recent first
        self._now = 0
        self._since_halving = 0
        self._history = _History(min_history, hash_fn)
        # While the stored objects' histories move to a grown table (`_history.old` kept):
        # the walk over the order, the access at which the table grew (an object stored
        # then has a last access no later), and the count the whole rebuild gave (1, 0 once halved).
        self._walk: Iterator[list] | None = None
        self._grown_at = 0
        self._fresh = 1
        self._spare: _Spare | None = None  # the next table's, from the end of the last growth's walk on
        # (time, gap) of recent hits, gaps decreasing: the head is the largest in the window.
        self._hit_gaps: deque[tuple[int, int]] = deque()

    # -- what is stored --------------------------------------------------------
    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, slot: str) -> bool:
        return slot in self._order

    def add(self, slot: str) -> None:
        """`slot` is stored now (a newcomer admitted, or loaded at start-up), most recently used."""
        self._order.put(slot, self._now)
        if self._walk is not None:
            self._adopt(slot, self._now)  # stored by the growth's own access: the rebuild would have met it
            self._step()
        stored, size = len(self._order), self._history.size
        if stored * 8 > size and self._walk is None:  # past half way to the next growth: from the end of the last one's walk on
            if self._spare is None or self._spare.size != size * 2:
                self._spare = _Spare(size * 2)
            self._spare.fill(size // 4 + 1 - stored)
        if stored * 4 > size:
            self._grow()

    def remove(self, slot: str) -> None:
        if self._walk is not None:  # it was stored, maybe at the growth: its history stays as the rebuild left it
            self._adopt(slot, self._order.get(slot))
        self._order.pop(slot)

    def victims(self) -> Iterator[str]:
        """The stored slots that may go, first to go first (least recently used): the
        store's index leaves out those pinned (cachenode/store/rows.py `RowOrder.park`)."""
        return iter(self._order)

    def victim(self) -> str | None:
        return next(iter(self._order), None)

    # -- reads ---------------------------------------------------------------
    def hit(self, slot: str) -> int | None:
        """A read of stored `slot`; the reads since its previous one (None: not stored)."""
        self._tick()
        last = self._order.get(slot)
        if last is None:
            return None
        gap = self._now - last
        self._hit_gap(gap)
        if self._walk is not None:
            self._adopt(slot, last)
        self._order.put(slot, self._now)
        self._history.write(slot, self._now)
        return gap

    def missed(self, slot: str) -> Candidate:
        """A read of `slot`, not stored: what the history says of it, then counted."""
        count, gap = self.missed_gap(slot)
        return Candidate(slot=slot, count=count, gap=gap, at=self._now)

    def missed_gap(self, slot: str) -> tuple[int, int | None]:
        """`missed`, its count and gap alone: what the census asks of every newcomer
        stored, without a `Candidate` built and thrown away."""
        self._tick()
        now = self._now
        if self._walk is not None:  # a stored slot's newcomer (a replacement) reads its history first
            self._adopt(slot, self._order.get(slot))
        last, count = self._history.write(slot, now)
        return count, None if last == _NEVER else now - last

    def candidate(self, slot: str) -> Candidate:
        """What `missed` would say of a read of `slot` now, counted nowhere: a
        newcomer judged before its write, which may yet fail (and leave the
        policy as it was) or be retried (and must not be counted twice)."""
        return self._seen(slot, self._now + 1)

    def _seen(self, slot: str, now: int) -> Candidate:
        last, count = self._history.read(slot)
        if last == _NEVER and self._walk is not None:
            last, count = self._unmoved(slot)
        return Candidate(slot=slot, count=count, gap=None if last == _NEVER else now - last, at=now)

    def _unmoved(self, slot: str) -> tuple[int, int]:
        """What the whole rebuild gave `slot` when neither table has its history, while a
        migration runs: (its last access, 1 halved since) if it was stored at the growth."""
        stored = self._order.get(slot)
        if stored is not None and stored <= self._grown_at:
            return stored, self._fresh
        return _NEVER, 0

    # -- decisions -------------------------------------------------------------
    def displaces(self, candidate: Candidate, victim: str) -> bool:
        """May `candidate` take the room of stored `victim`? (rules 1 and 2 of the module's docstring)"""
        last, count = self._history.read(victim)
        if last == _NEVER and self._walk is not None:
            count = self._unmoved(victim)[1]
        if candidate.count > count:
            return True
        gap = candidate.gap
        if gap is None or gap > max(1, len(self._order)):
            return False
        last = self._order.get(victim)
        idle = candidate.at - (candidate.at if last is None else last)
        return idle > gap and idle > self._margin * self._recent_hit_gap()

    # -- internals -------------------------------------------------------------
    def _tick(self) -> None:
        self._now += 1
        self._since_halving += 1
        if self._since_halving >= max(64, int(self._halving * len(self._order))):
            self._since_halving = 0
            self._history.halve()
            self._fresh = 0
        if self._walk is not None:
            self._step()

    def _hit_gap(self, gap: int) -> None:
        gaps = self._hit_gaps
        while gaps and gaps[-1][1] <= gap:
            gaps.pop()
        gaps.append((self._now, gap))

    def _recent_hit_gap(self) -> int:
        """The largest gap between two reads of a stored object among the hits of the last `window` accesses."""
        horizon = self._now - max(1, int(self._window * len(self._order)))
        gaps = self._hit_gaps
        while gaps and gaps[0][0] <= horizon:
            gaps.popleft()
        return gaps[0][1] if gaps else 0

    def _grow(self) -> None:
        """A history table four times the objects stored: start a larger one, and a walk
        that moves the stored objects' histories into it (`_STEP`'s comment: the one
        under way has always ended by then; were it not, it ends first)."""
        while self._walk is not None:
            self._step()
        size = self._history.size * 2
        while len(self._order) * 4 > size:
            size *= 2
        self._history = _History(size, self._hash, old=self._history, spare=self._spare)
        self._spare = None
        self._walk = self._order.walk(_STEP)
        self._grown_at, self._fresh = self._now, 1

    def _step(self) -> None:
        """The next `_STEP` stored objects' histories moved; the old table dropped once all are."""
        batch = next(self._walk, None)
        if batch is None:
            self._walk = None
            self._history.old = None
            return
        for slot, last in batch:
            self._adopt(slot, last)

    def _adopt(self, slot: str, last: int | None) -> None:
        """Stored `slot`'s history moved (`last`: its last access; None: not stored), if it
        was stored at the growth; one stored since without a read had none in the rebuild."""
        if last is not None and last <= self._grown_at:
            self._history.adopt(slot, last, self._fresh)
