"""The index's hash table: a slot's hash -> its row (cachenode/store/rows.py). Pure: no I/O.

Open addressing with linear probing over an array of rows (int32), at
most half full, deletions by backward shift (no tombstones), the hashes
read from the rows themselves: 8 to 16 bytes per object. Two slots
sharing 64 bits of hash cannot both be in the table: the index compares
the whole digest, and a newcomer takes the row of the other.

A doubling is not a rebuild in one go, which would hold the event loop
in proportion to the objects stored (about 90 ms at 262,144 objects, 0.5 s at a
million): as Redis's dict does, it keeps the old array and moves its
entries over a few at a time on the inserts and deletes that follow. The
old array, 8 bytes per object at the doubling, goes when its last entry
has moved. Nor is the new array made in one go (20 ms of page faults at a
million objects): the last inserts before a doubling make it ready a
chunk at a time, in anonymous memory (no file), 16 bytes per object for
that while.
"""

from __future__ import annotations

import mmap
from array import array

EMPTY = -1  # no row


# Old slots a migration visits per insert or delete: each visit either moves
# the entry there to the new array or, the slot empty, passes it. A doubling
# from S slots to 2S starts at S/2 entries (all in the old array) and the
# next one comes when the count reaches S: at least S/2 inserts later, each
# of which migrates first (the one that doubles again too). The migration
# visits at most S + S/2 times (S slots passed, S/2 entries moved, fewer if
# some were deleted), so it has ended by then whenever
#     STEPS * S/2 >= S + S/2,  that is STEPS >= 3
# (tests/unit/cachenode/store/test_table_growth.py asserts it, and that no
# insert finds a migration still under way at a doubling). Deletes migrate
# too: they only hasten the end. More than 3 so that the old array, 8 bytes
# per object at the doubling, goes after 3S/16 inserts instead of S/2, and a
# miss stops looking in it early; a migrating insert takes some microseconds.
STEPS = 8

# Slots of the next doubling's array made EMPTY per insert as the doubling
# nears. Made in one go, the array twice the size (16 MB at a million
# objects) cost the doubling insert 20 ms of page faults on this machine.
# An array of S slots starts on the next one of 2S when 4 * S / CHUNK
# inserts are left before its doubling, twice the 2 * S / CHUNK it takes,
# so that a doubling only swaps it in (from S = CHUNK / 2 on: smaller
# arrays are made at once, at no cost). Held, it costs 16 bytes per object:
# deletes that take the count another 4 * S / CHUNK below where making it
# began let it go.
CHUNK = 256
_CHUNK = array("i", [EMPTY]) * CHUNK


class Table:
    """hash -> row, for rows whose hash `hashes[row]` holds.

    Grown without a stall: a doubling keeps the old array (`_old`) and
    takes up one twice its size, made ready beforehand (`_spare`, see
    CHUNK); inserts go to the new array, each insert and delete then moves
    the entries of a few old slots (`STEPS`) over, and a look that misses
    in the new array looks in the old one while a migration is under way.
    An entry is in exactly one of the two, with its row, so every answer
    is what a whole rebuild would give."""

    def __init__(self, hashes: array, size: int = 1024) -> None:
        self._hashes = hashes
        self._rows = array("i", [EMPTY]) * size
        self._mask = size - 1
        self._count = 0  # in both arrays
        self._old: array | None = None  # the array before the last doubling, until its migration ends
        self._cursor = 0  # the old array's slots before it are empty (see `_migrate`)
        self._moved = 0  # entries migrated, ever: the tests count each operation's work by it
        self._spare: memoryview | None = None  # the next doubling's array, made ready as it nears (see CHUNK)
        self._ready = 0  # its slots made EMPTY so far
        self._prepare_at = _prepare_at(size)  # from this count on, inserts make it
        # The last hash looked for and its row (EMPTY: not held), until the
        # next insert or delete: a hit finds its row once for the index and
        # twice more for its policy's order, and a newcomer is looked for
        # about four times before its insert (admitted, replacing, held, added).
        # A migration neither adds nor removes a hash and moves an entry
        # with its row, so it leaves the memo true.
        self._memo: tuple[int | None, int] = (None, EMPTY)

    def __len__(self) -> int:
        return self._count

    def find(self, h: int) -> int:
        """The row of hash `h`, or EMPTY."""
        memo = self._memo
        if memo[0] == h:
            return memo[1]
        rows, hashes, mask = self._rows, self._hashes, self._mask
        i = h & mask
        while True:
            r = rows[i]
            if r == EMPTY:
                if self._old is not None:  # not moved over yet?
                    old = self._old
                    i = _slot(old, hashes, len(old) - 1, h)
                    if i >= 0:
                        r = old[i]
                break
            if hashes[r] == h:
                break
            i = (i + 1) & mask
        self._memo = (h, r)
        return r

    def insert(self, h: int, row: int) -> None:
        """`row` as the row of hash `h`, which the table must not hold yet (and
        its answer to the next look: its policy's order finds it next)."""
        if self._old is not None:
            self._migrate(STEPS)
        if (self._count + 1) * 2 > len(self._rows):
            self._grow()
        elif self._count >= self._prepare_at:
            self._prepare()
        rows, mask = self._rows, self._mask
        i = h & mask
        while rows[i] != EMPTY:
            i = (i + 1) & mask
        rows[i] = row
        self._count += 1
        self._memo = (h, row)

    def delete(self, h: int) -> None:
        """Forget hash `h` (nothing if absent), from whichever array holds it."""
        self._memo = (None, EMPTY)
        rows, hashes, mask = self._rows, self._hashes, self._mask
        i = _slot(rows, hashes, mask, h)
        old = self._old
        if old is not None:
            if i < 0:
                rows, mask = old, len(old) - 1
                i = _slot(rows, hashes, mask, h)
            if i >= 0:
                _shift_back(rows, hashes, mask, i)
                self._count -= 1
            self._migrate(STEPS)
        elif i >= 0:
            _shift_back(rows, hashes, mask, i)
            self._count -= 1
        if self._spare is not None and self._count < self._prepare_at - 4 * len(self._rows) // CHUNK:
            self._spare = None  # a store that shrank back holds no array for a doubling not in sight

    def _grow(self) -> None:
        if self._old is not None:  # never with STEPS >= 3 (see STEPS); were it to happen, end it here
            self._migrate(2 * len(self._old))
        self._old = self._rows
        self._cursor = 0
        size = len(self._old) * 2
        spare, self._spare = self._spare, None
        # Not ready only in tables too small to make it a chunk at a time
        # (a delete-free run of inserts always finishes it: see CHUNK).
        self._rows = spare if spare is not None and self._ready == size else array("i", [EMPTY]) * size
        self._mask = size - 1
        self._prepare_at = _prepare_at(size)

    def _prepare(self) -> None:
        """A chunk more of the next doubling's array made EMPTY, until all of it is.

        The array is anonymous memory mapped whole at once, no page of it
        touched: grown chunk by chunk instead (`array.extend`), it would be
        reallocated and copied now and then, 4 to 5 ms at once at a million
        objects."""
        if self._spare is None:
            self._spare = memoryview(mmap.mmap(-1, 2 * len(self._rows) * _CHUNK.itemsize,
                                               flags=mmap.MAP_PRIVATE)).cast("i")
            self._ready = 0
        if self._ready < len(self._spare):
            self._spare[self._ready:self._ready + CHUNK] = _CHUNK
            self._ready += CHUNK

    def _migrate(self, steps: int) -> None:
        """Move the entries of the old array's next slots to the new one, `steps` visits at most.

        An entry leaves the old array by the backward-shift delete any delete
        uses, so the old array stays a valid linear-probing table at every
        step and `find` and `delete` still find in it what has not moved.
        The cursor's slot is emptied before the cursor passes it: while it
        holds an entry, that entry moves, and the shift may pull the next
        one of its run back into it. Every slot before the cursor stays
        empty, so nothing is skipped: a backward shift from a hole fills only
        holes after it in its run (cyclically), the hole is at or after the
        cursor (slots before it hold nothing to delete), and for the fill to
        wrap past the array's end into the slots before the cursor the run
        would have to go through slot 0, empty once the cursor left it. With
        the cursor at 0 the entries a run wrapped into the array's first
        slots move first; an entry the shift pulls from slot 0 back to the
        end is met again there. At the end every old slot is empty: the old
        array goes."""
        old, hashes, rows, mask = self._old, self._hashes, self._rows, self._mask
        assert old is not None
        last = len(old) - 1
        at = self._cursor
        for _ in range(steps):
            r = old[at]
            if r == EMPTY:
                if at == last:
                    self._old = None
                    self._cursor = 0
                    return
                at += 1
                continue
            _shift_back(old, hashes, last, at)
            i = hashes[r] & mask
            while rows[i] != EMPTY:
                i = (i + 1) & mask
            rows[i] = r
            self._moved += 1
        self._cursor = at


def _prepare_at(size: int) -> int:
    """The count from which inserts make the next doubling's array ready, for an array of `size`
    slots: 4 * size / CHUNK inserts before the doubling (never below CHUNK / 2 slots: made at once there)."""
    return size // 2 - 4 * size // CHUNK if 2 * size >= CHUNK else size


def _slot(rows: array, hashes: array, mask: int, h: int) -> int:
    """Where in `rows` (a probing table of mask `mask`) hash `h` is, or -1."""
    i = h & mask
    while True:
        r = rows[i]
        if r == EMPTY:
            return -1
        if hashes[r] == h:
            return i
        i = (i + 1) & mask


def _shift_back(rows: array, hashes: array, mask: int, i: int) -> None:
    """Empty slot `i` of `rows`: later entries of its probe run shift back into
    the hole, so every entry stays reachable from its home with no tombstone."""
    j = i
    while True:
        j = (j + 1) & mask
        r = rows[j]
        if r == EMPTY:
            break
        home = hashes[r] & mask
        # Move r back into the hole at i unless its home lies cyclically in (i, j].
        if (i < j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            rows[i] = r
            i = j
    rows[i] = EMPTY
