"""The index's rows: what eviction and lookup need of each stored object, in
parallel arrays, a few tens of bytes each. Pure: no I/O.

A store holds millions of small objects, and a Python object per stored
object (a `Meta`, its strings, a dict entry, an order entry) costs about a
kilobyte of memory. So a row is an integer, and what the store knows of the
object in it lives in arrays indexed by that integer (docs/cache-node.md
"Memory per object"):

- the SHA-256 of its slot (its file names come from it; the first 8 bytes,
  signed, are its hash in `Table`, cachenode/store/table.py),
- its size in bytes, the nonce of its data file's name, a few flags,
- its eviction policy's state: last access and its place in its kind's
  least-recently-used list (`RowOrder`, links between rows as int32), or
  in the list of its kind's rows that may not go now (pinned: `PARKED`).

The rest of its record (key, URL, headers, expiry...) is on disk, in its
file; the index reads it on a hit (cachenode/store/index.py). Rows of
objects that left are reused, so the arrays never hold holes for long.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Iterator

from cachenode.store.table import EMPTY, Table

DIGEST = 32  # bytes of a SHA-256

# flags
HOT = 1
EXTRA = 2
SEALED = 4  # a small object's sealed file (`.obj`); else a `.data` beside its `.meta`
LINKED = 8  # in its kind's order
USED = 16  # the row holds an object
PARKED = 32  # in its kind's order, but out of the walk eviction makes: it may not go now (pinned)
_UNLINKED = ~(LINKED | PARKED) & 0xFF


def digest_of(slot: str) -> bytes:
    """The SHA-256 of a slot: its files' names (nezha/keys.py `object_id` is its hex) and its row's hash.

    The last slot's digest is remembered: a store's commit asks for the same
    slot's about seven times in a row (is it held, its candidate, its arrival,
    its add, what it replaces), each a hash of the whole key."""
    global _last
    last = _last  # one read: a (slot, digest, hash) triple is replaced whole, never changed
    if last[0] == slot:
        return last[1]
    digest = hashlib.sha256(slot.encode("utf-8", "surrogateescape")).digest()
    _last = (slot, digest, int.from_bytes(digest[:8], "little", signed=True))
    return digest


def hash_of(digest: bytes) -> int:
    """A slot's hash in the table: the first 8 bytes of its digest, as a signed 64-bit int
    (the last slot's remembered with its digest: a commit asks for it about eight times)."""
    last = _last
    return last[2] if last[1] is digest else int.from_bytes(digest[:8], "little", signed=True)


_last: tuple[str | None, bytes, int] = (None, b"", 0)


class Rows:
    """The parallel arrays, and the free rows to reuse."""

    def __init__(self) -> None:
        self.hashes = array("q")
        self.digests = bytearray()
        self.sizes = array("q")
        self.nonces = array("q")  # the data file's 48-bit nonce; EMPTY: its record is kept in memory
        self.flags = bytearray()
        self.last = array("q")  # the policy's last access
        self.prev = array("i")
        self.next = array("i")
        self._free = array("i")
        self.table = Table(self.hashes)
        self.count = 0

    def find(self, digest: bytes) -> int:
        """The row of the slot whose SHA-256 is `digest`, or EMPTY."""
        row = self.table.find(hash_of(digest))
        if row != EMPTY and self.digests[row * DIGEST:(row + 1) * DIGEST] != digest:
            return EMPTY  # 64 bits alike, another slot
        return row

    def new(self, digest: bytes, *, size: int, nonce: int, flags: int) -> int:
        """A row for a slot the table does not hold yet (`find` gave EMPTY and `take` freed any other of its hash)."""
        h = hash_of(digest)
        if self._free:
            row = self._free.pop()
            self.hashes[row], self.sizes[row], self.nonces[row] = h, size, nonce
            self.digests[row * DIGEST:(row + 1) * DIGEST] = digest
            self.flags[row], self.last[row], self.prev[row], self.next[row] = flags | USED, 0, EMPTY, EMPTY
        else:
            row = len(self.hashes)
            self.hashes.append(h)
            self.sizes.append(size)
            self.nonces.append(nonce)
            self.digests += digest
            self.flags.append(flags | USED)
            self.last.append(0)
            self.prev.append(EMPTY)
            self.next.append(EMPTY)
        self.table.insert(h, row)
        self.count += 1
        return row

    def holder(self, digest: bytes) -> int:
        """The row that holds `digest`'s hash, whichever slot it is (EMPTY: none)."""
        return self.table.find(hash_of(digest))

    def free(self, row: int) -> None:
        """Row `row` holds nothing any more (it must be unlinked from its order first)."""
        self.table.delete(self.hashes[row])
        self.flags[row] = 0
        self._free.append(row)
        self.count -= 1

    def digest(self, row: int) -> bytes:
        return bytes(self.digests[row * DIGEST:(row + 1) * DIGEST])

    def used(self) -> Iterator[int]:
        """Every row that holds an object, in row order."""
        flags = self.flags
        return (r for r in range(len(flags)) if flags[r] & USED)

    def pack(self, start: int, count: int) -> tuple[int, bytes]:
        """Rows `start` to `start + count` (fewer at the end) as they are now, free
        ones included: (how many, their digests, sizes, nonces and flags, array
        after array). Slices of the arrays, no loop: a node's other workers get
        a million rows this way (cachenode/workers/primary.py) at little cost."""
        stop = min(start + count, len(self.flags))
        if stop <= start:
            return 0, b""
        return stop - start, b"".join((self.digests[start * DIGEST:stop * DIGEST], self.sizes[start:stop].tobytes(),
                                       self.nonces[start:stop].tobytes(), bytes(self.flags[start:stop])))

    def pack_rows(self, rows: list[int]) -> bytes:
        """Rows `rows` as `pack` gives a run of them: for rows that are not next to each other."""
        sizes, nonces, flags = self.sizes, self.nonces, self.flags
        return b"".join((b"".join(self.digests[r * DIGEST:(r + 1) * DIGEST] for r in rows),
                         array("q", [sizes[r] for r in rows]).tobytes(),
                         array("q", [nonces[r] for r in rows]).tobytes(), bytes(flags[r] for r in rows)))


PACKED_ROW = DIGEST + 8 + 8 + 1  # bytes of one row as `Rows.pack` gives it


def unpack(n: int, packed: bytes) -> Iterator[tuple[bytes, int, int, int]]:
    """(digest, size, nonce, flags) of each row `Rows.pack` gave, free ones too;
    ValueError when `packed` is not `n` rows."""
    if len(packed) != n * PACKED_ROW:
        raise ValueError(f"{len(packed)} bytes are not {n} packed rows of {PACKED_ROW} bytes")
    sizes, nonces = array("q"), array("q")
    at = n * DIGEST
    sizes.frombytes(packed[at:at + 8 * n])
    nonces.frombytes(packed[at + 8 * n:at + 16 * n])
    flags = packed[at + 16 * n:]
    return ((packed[i * DIGEST:(i + 1) * DIGEST], sizes[i], nonces[i], flags[i]) for i in range(n))


class RowOrder:
    """One kind's least-recently-used order over the rows, as the eviction
    policy keeps it (cachenode/store/policy.py `Order`): the policy names an
    object by its slot's hash, the order finds its row through the table.

    A row `park`ed (its object is pinned: cachenode/store/index.py) stays in
    the order, its last access read and written as any other's, but in a
    list of its own that the walk (`__iter__`) never enters: eviction looks
    at as many rows as it needs, however many are pinned. `unpark` puts it
    at the back of the walk, as passing over a pinned object always did."""

    def __init__(self, rows: Rows, member: int) -> None:
        self._rows = rows
        self._member = member  # the kind's flags (HOT, EXTRA or 0): a row is in one order only
        self.head = EMPTY  # least recently used
        self.tail = EMPTY
        self.parked = EMPTY  # the first parked row, its list in no order
        self._len = 0  # rows linked, parked ones too

    def __len__(self) -> int:
        return self._len

    def _row(self, h: int) -> int:
        rows = self._rows
        row = rows.table.find(h)
        if row == EMPTY or not rows.flags[row] & LINKED or rows.flags[row] & (HOT | EXTRA) != self._member:
            return EMPTY
        return row

    def __contains__(self, h: int) -> bool:
        return self._row(h) != EMPTY

    def get(self, h: int) -> int | None:
        """The last access of `h`; None when it is not in this order."""
        row = self._row(h)
        return None if row == EMPTY else self._rows.last[row]

    def put(self, h: int, now: int) -> None:
        """`h` accessed at `now`: the most recently used (parked, it stays so). Its row must exist."""
        rows = self._rows
        row = rows.table.find(h)
        if row == EMPTY:
            raise KeyError(f"no row holds hash {h}: the index adds a row before its policy does")
        if rows.flags[row] & LINKED:
            if row == self.tail or rows.flags[row] & PARKED:
                rows.last[row] = now
                return
            self._unlink(row)
        rows.last[row] = now
        rows.prev[row], rows.next[row] = self.tail, EMPTY
        if self.tail == EMPTY:
            self.head = row
        else:
            rows.next[self.tail] = row
        self.tail = row
        rows.flags[row] |= LINKED
        self._len += 1

    def pop(self, h: int) -> None:
        row = self._row(h)
        if row != EMPTY:
            self._unlink(row)

    def park(self, h: int) -> None:
        """`h` out of the walk, still in the order (nothing if it is not in it, or parked already)."""
        row = self._row(h)
        rows = self._rows
        if row == EMPTY or rows.flags[row] & PARKED:
            return
        self._unlink(row)
        rows.prev[row], rows.next[row] = EMPTY, self.parked
        if self.parked != EMPTY:
            rows.prev[self.parked] = row
        self.parked = row
        rows.flags[row] |= LINKED | PARKED
        self._len += 1

    def unpark(self, h: int) -> None:
        """`h` back in the walk, at its end, its last access kept (nothing if it is not parked here)."""
        row = self._row(h)
        if row != EMPTY and self._rows.flags[row] & PARKED:
            self._unlink(row)
            self.put(h, self._rows.last[row])

    def _unlink(self, row: int) -> None:
        rows = self._rows
        p, n = rows.prev[row], rows.next[row]
        if p != EMPTY:
            rows.next[p] = n
        elif rows.flags[row] & PARKED:
            self.parked = n
        else:
            self.head = n
        if n != EMPTY:
            rows.prev[n] = p
        elif not rows.flags[row] & PARKED:
            self.tail = p
        rows.prev[row] = rows.next[row] = EMPTY
        rows.flags[row] &= _UNLINKED
        self._len -= 1

    def __iter__(self) -> Iterator[int]:
        """The hashes of the rows not parked, least recently used first."""
        rows = self._rows
        row = self.head
        while row != EMPTY:
            nxt = rows.next[row]
            yield rows.hashes[row]
            row = nxt

    def items(self) -> Iterator[tuple[int, int]]:
        """(hash, last access) of every row in the order, the walk's then the parked ones."""
        rows = self._rows
        for row in (self.head, self.parked):
            while row != EMPTY:
                yield rows.hashes[row], rows.last[row]
                row = rows.next[row]

    def walk(self, count: int) -> Iterator[list[tuple[int, int]]]:
        """The policy's `Order.walk`: by row index, not along the list, since a row the
        list would resume from may leave or move to the back between two batches. Over
        the rows that exist at the start (rows added later are objects stored since).

        The rows are every kind's, so a batch stops at `count` of this order's or
        after a window of `count` times the rows per object of this order at the
        start, scanned in C (memchr, for each flags byte a row of the order may
        have): at most ceil(N / `count`) windows for N objects, the rest of the
        batches full."""
        rows = self._rows
        end = len(rows.flags)
        window = count * -(-end // max(1, self._len))
        values = _IN_ORDER[self._member]
        at = 0
        while at < end:
            stop, batch, flags = min(at + window, end), [], rows.flags
            found = [flags.find(v, at, stop) for v in values]  # each value's next row (-1: none in the window)
            while len(batch) < count:
                row = min((r for r in found if r >= 0), default=-1)
                if row < 0:
                    at = stop
                    break
                batch.append((rows.hashes[row], rows.last[row]))
                at = row + 1
                found = [flags.find(v, at, stop) if r == row else r for v, r in zip(values, found)]
            yield batch


_FLAGS = HOT | EXTRA | SEALED | LINKED | USED | PARKED
# The flags bytes of a row in the order of each kind: linked, used, that kind, sealed or not, parked or not
# (a parked row is in the order, out of eviction's walk only: its history moves at a growth as any other's).
_IN_ORDER = {member: [v for v in range(_FLAGS + 1) if v & ~(SEALED | PARKED) == member | LINKED | USED]
             for member in (0, HOT, EXTRA)}
