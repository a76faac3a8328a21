"""A fill's readers: each client's file on the fill's bytes and how far it
has sent, and, once the store could not write the body, the bytes past
the disk held in memory for them.

Memory stays bounded: the fill reads its source no further than `window`
bytes ahead of its slowest open reader (as a pass-through reads no faster
than its client), and a reader that takes nothing for `patience` seconds
while others wait on it is cut off. The fill (cachenode/fill/buffer.py
`Fill`) owns the received count and the errors it raises; this object
only keeps the readers' positions and the bytes they still need.
"""

from __future__ import annotations

import asyncio
import io
import weakref
from collections import deque
from typing import IO, Callable

# Bytes an unstored fill (the store could not write) holds in memory beyond
# what its slowest reader has sent: the node never holds a whole object.
MEMORY_WINDOW = 8 * 1024 * 1024
# Seconds a fill waits on a reader that takes nothing while the window is
# full before cutting that reader off, so one stalled client cannot stall
# every other client of the fill (the origin read timeout's default).
READER_PATIENCE = 30.0


class Reader(io.BufferedReader):
    """One client's file on a fill's bytes. Closing it tells the fill that this
    reader needs nothing more, so an unstored fill stops waiting for it."""

    def __init__(self, fd: int, readers: "Readers") -> None:
        super().__init__(io.FileIO(fd, "rb"))
        self._readers: Readers | None = readers

    def close(self) -> None:
        readers, self._readers = getattr(self, "_readers", None), None
        if readers is not None:
            readers.gone(self)
        super().close()


class Readers:
    """The open readers of one fill, and the bytes held in memory for them
    once the store failed (`spilled_at`: the bytes on disk then, frozen)."""

    def __init__(self, *, received: Callable[[], int], window: int = MEMORY_WINDOW,
                 patience: float = READER_PATIENCE) -> None:
        self._received = received  # the fill's bytes arrived so far
        self.window = window
        self.patience = patience
        self.spilled_at: int | None = None
        self.memory: deque[tuple[int, bytes]] = deque()  # (offset, chunk), in order
        self._room = asyncio.Event()
        # Each open reader and how far it has sent; readers cut off for stalling.
        self._positions: weakref.WeakKeyDictionary[Reader, int] = weakref.WeakKeyDictionary()
        self._cut: weakref.WeakSet[Reader] = weakref.WeakSet()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def open(self, fd: int) -> Reader:
        """A reader of its own on the descriptor `fd`, at byte 0."""
        reader = Reader(fd, self)
        self._positions[reader] = 0
        return reader

    def memory_start(self) -> int:
        return self.memory[0][0] if self.memory else self._received()

    def held(self, offset: int, upto: int) -> memoryview | None:
        """The bytes from `offset` up to at most `upto` held in memory; None when no longer held."""
        for start, data in self.memory:
            if start <= offset < start + len(data):
                return memoryview(data)[offset - start:min(upto, start + len(data)) - start]
        return None

    def was_cut(self, reader: IO[bytes]) -> bool:
        return reader in self._cut

    def _needed_from(self) -> int:
        """The first byte some open reader may still ask of the memory."""
        assert self.spilled_at is not None
        if not self._positions:
            return self._received()
        return max(self.spilled_at, min(self._positions.values()))

    def trim(self) -> None:
        if self.spilled_at is None:
            return
        needed = self._needed_from()
        while self.memory and self.memory[0][0] + len(self.memory[0][1]) <= needed:
            self.memory.popleft()

    def advance(self, reader: IO[bytes], offset: int) -> None:
        """`reader` has sent every byte before `offset`: memory it no longer needs can go."""
        position = self._positions.get(reader)  # type: ignore[call-overload]
        if position is None or offset <= position:
            return
        self._positions[reader] = offset  # type: ignore[index]
        if self.spilled_at is not None:
            self.trim()
            self._room_changed()

    def _room_changed(self) -> None:
        self._room.set()
        self._room = asyncio.Event()

    def gone(self, reader: Reader) -> None:
        """A reader closed its file: it needs no more bytes, so nothing waits for it."""
        self._positions.pop(reader, None)
        if self.spilled_at is None:
            return
        self.trim()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._room_changed()
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._room_changed)  # closed by a collector in another thread

    async def wait_for_room(self, notify: Callable[[], None]) -> None:
        """Read the origin no further than the window ahead of the slowest open
        reader; cut off a reader that holds everyone up for `patience` seconds
        (`notify` wakes the readers waiting for bytes, so a cut one learns at once)."""
        while self._positions and self._received() - self._needed_from() > self.window:
            room = self._room
            try:
                async with asyncio.timeout(self.patience):  # not wait_for: it can swallow a cancel
                    await room.wait()
            except asyncio.TimeoutError:
                slowest = min(self._positions.values())
                if all(p == slowest for p in self._positions.values()):
                    continue  # nobody else waits on them: wait, as a pass-through waits for its client
                for reader, position in list(self._positions.items()):
                    if position == slowest:
                        self._positions.pop(reader, None)
                        self._cut.add(reader)
                self.trim()
                notify()
