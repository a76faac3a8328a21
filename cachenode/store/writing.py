"""One object on its way into the store: the store's one way to write.

Every writer (a fill's buffer, a chunked object's manifest, an assembly of
signed parts, a chunk) follows the same protocol: a temp file in tmp/,
room reserved for the bytes it expects (evicting others first), then either
a commit (fsync, rename: the object is servable) or a discard (the file goes,
the room is given back). `ObjectWrite` owns those steps, so no writer can
commit twice, forget to give the room back, or leave a temp file behind.

As an async context (`async with store.writing(reserve=n) as w:`) it
discards whatever was not committed when the block ends, error or not. A
write that outlives one block (a fill read by its clients as it grows, an
assembly whose parts come in several requests) holds the same object and
ends it with `commit` or `discard`; both are safe to call once the other ran.
"""

from __future__ import annotations

from typing import Protocol

from cachenode.store.objects import Meta, TempObject, close_reader
from nezha.errors import StoreError


class Disk(Protocol):
    """The steps of the store an `ObjectWrite` takes (cachenode/store/disk.py `Store`)."""

    async def new_temp(self, expect: int = 0) -> TempObject: ...

    def reserve(self, size: int) -> None: ...

    async def commit(self, temp: TempObject, meta: Meta, *, expect: str | None = None) -> Meta: ...

    async def discard(self, temp: TempObject) -> None: ...


class ObjectWrite:
    """One object being written: its temp file (`temp`), `reserve` bytes of
    room held for it until it ends, and its end (`commit` or `discard`).

    `readable=False` closes the temp file's reading descriptor at once: for
    a writer nobody reads while it grows (a manifest, an assembly), which
    would otherwise hold it open for good. `must_write=True`: a writer with
    no way around the disk (an assembly) is refused at `open` when the temp
    file cannot be created, before any room is reserved; a fill streams
    through memory instead (cachenode/fill/buffer.py), so it takes the
    stand-in file `Store.new_temp` gives."""

    def __init__(self, store: Disk, *, reserve: int = 0, readable: bool = True, must_write: bool = False) -> None:
        self._store = store
        self._reserve = reserve
        self._readable = readable
        self._must_write = must_write
        self._temp: TempObject | None = None
        self.stored: Meta | None = None  # what the commit stored, once it did
        self._ended = False

    @property
    def temp(self) -> TempObject:
        if self._temp is None:
            raise RuntimeError("an ObjectWrite has no temp file before it is opened")
        return self._temp

    async def open(self) -> "ObjectWrite":
        """Create the temp file and reserve the room. StoreError when the file
        system refuses even to create the file and no stand-in can be made
        (`Store.new_temp`), or, with `must_write`, when it cannot be created."""
        temp = await self._store.new_temp(expect=self._reserve)
        if self._must_write and temp.unwritable is not None:
            await self._store.discard(temp)
            raise StoreError(temp.unwritable)
        if not self._readable:
            close_reader(temp)
        temp.reserved = self._reserve
        self._store.reserve(self._reserve)
        self._temp = temp
        return self

    async def commit(self, meta: Meta, *, expect: str | None = None) -> Meta:
        """Make the written bytes the servable object `meta` names (`Store.commit`;
        `expect`: the summary of the block checksums its sender sent, for a copy);
        the reserved room becomes the object's. What the store raises (TooLarge,
        StoreError) passes on, the temp file still the caller's to discard."""
        stored = await self._store.commit(self.temp, meta, expect=expect)
        self.stored = stored
        self._ended = True
        return stored

    async def discard(self) -> None:
        """Drop the temp file and give the room back; nothing once committed or discarded."""
        if self._ended or self._temp is None:
            return
        self._ended = True
        await self._store.discard(self._temp)

    async def __aenter__(self) -> "ObjectWrite":
        return await self.open()

    async def __aexit__(self, *_: object) -> None:
        await self.discard()
