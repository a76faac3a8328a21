"""A row's record: the rest of what is stored of an object beyond its row
in the index (cachenode/store/rows.py), kept in memory, read lately, or
read back from the object's file and checked to name the row's slot.

Apart from the index (cachenode/store/index.py) because it is how a row
becomes a `Meta`, not what the index does with it: a mixin of `Index`,
which owns the tables it reads (module docstring there, "Memory").
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import AsyncIterator, Callable

from cachenode.store.objects import Meta
from cachenode.store.rows import EMPTY, SEALED, USED, Rows, digest_of

__all__ = ["Records", "digest_of", "SEALED_SUFFIX", "DATA_SUFFIX"]

SEALED_SUFFIX, DATA_SUFFIX = ".obj", ".data"  # cachenode/store/small.py SUFFIX; a large object's data file


def _read_all(read: Callable[[str, str], Meta | None], files: list[tuple[str, str]]) -> list[Meta | None]:
    return [read(oid, data) for oid, data in files]


class Records:
    """Needs of the class it is mixed into: `_rows`, `_kept` (row -> a record
    kept whole), `_recent` and `_recent_max` (the records read last), and
    `_records(oid, data)`, the store's reader of a record (None: none is read)."""

    _rows: Rows
    _kept: dict[int, Meta]
    _recent: OrderedDict[int, Meta]
    _recent_max: int
    _records: Callable[[str, str], Meta | None] | None

    def _meta(self, row: int) -> Meta | None:
        """Row `row`'s record: kept, read lately, or read from its file and checked; None when it cannot be."""
        kept = self._kept.get(row)
        if kept is not None:
            return kept
        recent = self._recent.get(row)
        if recent is not None:
            self._recent.move_to_end(row)
            return recent
        digest, data = self._rows.digest(row), self._data(row)
        meta = self._checked(row, digest, data,
                             self._records(digest.hex(), data) if self._records is not None else None)
        if meta is not None:
            self._remember(row, meta)
        return meta

    def _checked(self, row: int, digest: bytes, data: str, meta: Meta | None) -> Meta | None:
        """`meta`, read from data file `data`, if it is row `row`'s record: never another slot's."""
        rows = self._rows
        if meta is None or meta.data != data or meta.size != rows.sizes[row] or meta.vary \
                or digest_of(meta.slot) != digest:
            return None  # another record in its place (or none): never served as this slot's
        return meta

    async def each_meta(self, *, batch: int = 256, skip: int = 0) -> AsyncIterator[Meta]:
        """Every stored response, as `metas()`, the records read from disk in the
        executor a batch at a time: a walk over a million objects (the scrub, a
        hand-off) that never holds the event loop for long, nor a list of them
        all. Rows with any of the flags `skip` (cachenode/store/rows.py: HOT)
        are passed over unread. An object that left the index meanwhile is not
        given; one added meanwhile may not be."""
        loop = asyncio.get_running_loop()
        rows = self._rows
        at = 0
        while at < len(rows.flags):  # read again each time: the arrays grow while the walk runs
            asked = []
            for row in range(at, min(at + batch, len(rows.flags))):
                if not rows.flags[row] & USED or rows.flags[row] & skip:
                    continue
                if (kept := self._kept.get(row)) is not None:
                    yield kept
                else:
                    asked.append((row, rows.digest(row), self._data(row)))
            at += batch
            read = self._records
            if not asked or read is None:
                continue
            found = await loop.run_in_executor(None, _read_all, read, [(d.hex(), data) for _, d, data in asked])
            for (row, digest, data), meta in zip(asked, found):
                if rows.flags[row] & USED and rows.digest(row) == digest and self._data(row) == data:
                    if (meta := self._checked(row, digest, data, meta)) is not None:
                        yield meta

    def count(self, *, skip: int = 0) -> int:
        """Objects held whose rows have none of the flags `skip`, counted from the flags alone."""
        if not skip:
            return self._rows.count
        wanted = bytes(1 if v & USED and not v & skip else 0 for v in range(256))
        return self._rows.flags.translate(wanted).count(1)

    def _remember(self, row: int, meta: Meta) -> None:
        recent = self._recent
        recent[row] = meta
        recent.move_to_end(row)
        if len(recent) > self._recent_max:
            recent.popitem(last=False)

    def _nonce(self, meta: Meta, digest: bytes, chunk: tuple[str, int, int] | None) -> int:
        """The nonce of `meta`'s data file when its record can be read again from
        it (`{oid}.{12 hex}.obj|.data`, no variant, no chunk: `chunk_of(meta.key)`
        is `chunk`); EMPTY: keep it in memory."""
        if self._records is None or meta.vary or chunk is not None:
            return EMPTY
        parts = meta.data.split(".")
        if len(parts) != 3 or parts[0] != digest.hex() or len(parts[1]) != 12 \
                or f".{parts[2]}" not in (SEALED_SUFFIX, DATA_SUFFIX):
            return EMPTY
        try:
            return int(parts[1], 16)
        except ValueError:
            return EMPTY

    def _data(self, row: int) -> str:
        rows = self._rows
        oid = rows.digest(row).hex()
        return f"{oid}.{rows.nonces[row]:012x}{SEALED_SUFFIX if rows.flags[row] & SEALED else DATA_SUFFIX}"
