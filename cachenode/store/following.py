"""A follower's copy of the index (cachenode/workers/): built from the writer's
rows, then kept in step with the writer's changes, without reading a record.

Apart from the index (cachenode/store/index.py) because it is how another
process's index is copied, not what an index does: a mixin of `Index`,
which owns the rows and the records kept whole.

The writer sends its rows as they are (`packed`: slices of its arrays, no
record read), the records it keeps whole in memory (`kept`: variants and
chunks, which no file name finds again), and then every change in order. A
follower adds a row as the writer holds it (`add_rows`) and reads the rest
of its record from its file on a hit, as the writer does for a row it has
not read lately. Applying a change never reads a record either (`mirror`):
a follower's row whose file the writer has replaced meanwhile would read as
lost, and a follower deletes nothing.

Why a slice sent late is never older than what the follower already has:
each slice is packed the moment it is sent, on the same ordered link as the
changes, so it holds the writer's state at that point of the stream; a
change made after it comes after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachenode.store.objects import Meta
from cachenode.store.records import digest_of
from cachenode.store.rows import EMPTY, EXTRA, HOT, SEALED, USED, Rows, unpack

if TYPE_CHECKING:
    from cachenode.store.index import Index

_KIND = HOT | EXTRA | SEALED  # what a row's flags say of its object, beyond the index's own bookkeeping


class Following:
    """Needs of the class it is mixed into (`Index`): `_rows`, `_kept`, `add`, `drop`, `_release` and `_held`."""

    _rows: Rows
    _kept: dict[int, Meta]

    # -- the writer's side -----------------------------------------------------
    @property
    def row_span(self) -> int:
        """Rows in the arrays, free ones included: a join sends `packed` slices up to it."""
        return len(self._rows.flags)

    def packed(self, start: int, count: int) -> tuple[int, bytes]:
        """Rows `start` to `start + count` as they are now (cachenode/store/rows.py `Rows.pack`)."""
        return self._rows.pack(start, count)

    def packed_rows(self, rows: list[int]) -> bytes:
        return self._rows.pack_rows(rows)

    def row_of(self, slot: str) -> int:
        """The row holding `slot`, EMPTY when none does or its record is kept whole (sent as a record)."""
        row = self._rows.find(digest_of(slot))
        return EMPTY if row == EMPTY or row in self._kept else row

    def kept_rows(self) -> list[int]:
        """The rows whose record is kept whole, now."""
        return list(self._kept)

    def kept(self, row: int) -> Meta | None:
        """Row `row`'s record if it is kept whole now (None once it left)."""
        return self._kept.get(row)

    # -- the follower's side ---------------------------------------------------
    def add_rows(self: "Index", n: int, packed: bytes) -> int:
        """The writer's rows as `packed` gives them, each held here as it is there;
        how many were added. Free rows, and rows whose record is kept whole (they
        come as records), are passed over. ValueError when `packed` is not `n` rows."""
        rows = self._rows
        added = 0
        for digest, size, nonce, flags in unpack(n, packed):
            if not flags & USED or nonce == EMPTY:
                continue
            row = rows.find(digest)
            if row != EMPTY:
                if rows.nonces[row] == nonce and rows.flags[row] & _KIND == flags & _KIND:
                    continue  # held as it is: the change that put it here came first
                self._unrow(row)
            other = rows.holder(digest)
            if other != EMPTY:  # 64 bits of hash alike: the writer's row is the one it holds
                self._unrow(other)
            row = rows.new(bytes(digest), size=size, nonce=nonce, flags=flags & _KIND)
            # Outside the eviction order: a follower evicts nothing, and its order would cost it a third of a join.
            self._held(row, "hot" if flags & HOT else "extra" if flags & EXTRA else "only", size, ordered=False)
            added += 1
        return added

    def mirror(self: "Index", event: str, meta: Meta) -> None:
        """Apply one change the writer announced: "drop", or "put"/"load" `meta` in its slot."""
        row = self._rows.find(digest_of(meta.slot))
        if row != EMPTY:
            self._unrow(row)
        if event != "drop":
            self.add(meta)

    def _unrow(self: "Index", row: int) -> None:
        """Row `row` out, its record not read: a kept one through `drop`, which keeps the key's tables."""
        kept = self._kept.get(row)
        if kept is not None:
            self.drop(kept.slot)
        else:
            self._release(row)
