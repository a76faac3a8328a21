"""A fill's temp file in tmp/: created, written in order or at offsets,
spliced into from a socket, discarded. What a commit (cachenode/store/disk.py)
turns into a stored object.

A mixin of `Store`, as `IndexView` is: these steps need the store's temp
folder, its small-object bound and its room accounting, and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Callable

from cachenode.kernel.splice import FileWriteFailed, SocketBody
from cachenode.store.objects import TempObject
from nezha.errors import StoreError


class TempFiles:
    """Needs of the class it is mixed into: `tmp`, `small_max`, and `release(size)` (room accounting)."""

    tmp: Path
    small_max: int

    async def new_temp(self, expect: int = 0) -> TempObject:
        """A fill's temp file in tmp/.

        `expect`: the bytes the writer expects (0: not known). A small
        object's file is created and written on the event loop (`inline`).
        A file system that refuses even to create it (full, out of inodes,
        over quota) does not fail the request: the temp object is then one
        whose every write fails, its reader an empty file, so the fill
        streams the body through unstored as for any failed write.
        """
        path = self.tmp / f"{secrets.token_hex(12)}.part"
        def create() -> tuple[int, int]:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                return fd, os.open(path, os.O_RDONLY)
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise

        inline = 0 < expect <= self.small_max
        try:
            fd, read_fd = create() if inline else await asyncio.get_running_loop().run_in_executor(None, create)
        except OSError as e:
            try:
                empty = os.open(os.devnull, os.O_RDONLY)
            except OSError:
                raise StoreError(f"create {path}: {e}") from e
            return TempObject(path=path, fd=-1, read_fd=empty, unwritable=f"create {path}: {e}")
        if inline:
            return TempObject(path=path, fd=fd, read_fd=read_fd, inline=True, kept=bytearray())
        return TempObject(path=path, fd=fd, read_fd=read_fd)

    async def write(self, temp: TempObject, data: bytes) -> None:
        """Append `data` to the temp file; StoreError naming the file and the
        OS error (ENOSPC, EDQUOT, EIO...) when it cannot, with `temp.written`
        counting what did reach the file."""
        if temp.unwritable is not None:
            raise StoreError(temp.unwritable)

        def _write() -> None:
            def grew(n: int) -> None:
                temp.written += n  # readers may follow each step

            _pwrite_all(temp.fd, data, temp.written, grew)
            temp.wrote(len(data))
        try:
            if temp.inline and temp.written + len(data) <= self.small_max:
                if temp.kept is not None:
                    temp.kept += data
                _write()  # a few pages into the page cache: less than a hand-off to a thread costs
            else:
                temp.kept = None
                await asyncio.get_running_loop().run_in_executor(None, _write)
        except OSError as e:
            raise StoreError(f"write {temp.path}: {e}") from e

    async def write_at(self, temp: TempObject, offset: int, data: bytes | memoryview) -> None:
        """Write `data` at `offset` of the temp file (a parallel fill's range);
        `temp.written` is the fill's to set, as the contiguous prefix grows."""
        if temp.unwritable is not None:
            raise StoreError(temp.unwritable)

        def _write() -> None:
            _pwrite_all(temp.fd, data, offset)
            temp.wrote(len(data))
        temp.kept = None  # out of order: a small commit reads the file back
        try:
            await asyncio.get_running_loop().run_in_executor(None, _write)
        except OSError as e:
            raise StoreError(f"write {temp.path} at {offset}: {e}") from e

    async def pump_into(self, temp: TempObject, body: SocketBody, offset: int, *, end: Callable[[], int],
                        moved: Callable[[int], None], read_timeout: float,
                        started: Callable[[asyncio.Future], None] | None = None) -> int:
        """Move `body` from its socket into the temp file at `offset` by splice
        on a thread (cachenode/kernel/splice.py): `write_at` for a body that never
        enters Python. StoreError, as from `write_at`, when the file side
        fails; the socket's errors pass as they are."""
        if temp.unwritable is not None:
            raise StoreError(temp.unwritable)
        temp.kept = None  # never in Python: a small commit reads the file back
        try:
            return await body.pump_into(temp.fd, offset, end=end, moved=moved, read_timeout=read_timeout,
                                        started=started, landed=temp.wrote)
        except FileWriteFailed as e:
            raise StoreError(f"write {temp.path} at {e.at}: {e}") from e

    async def discard(self, temp: TempObject) -> None:
        """Drop a fill's temp file. Safe after a failed commit, which closed `fd` already."""
        self.release(temp.reserved)
        temp.reserved = 0
        if temp.committing is not None:
            # A commit whose caller was cancelled still runs in its thread; let it finish first.
            await asyncio.wait([temp.committing])
        if temp.inline:
            _close_and_remove(temp)
        else:
            await asyncio.get_running_loop().run_in_executor(None, _close_and_remove, temp)


def _close_and_remove(temp: TempObject) -> None:
    """Close a temp file not committed (its `fd`, if still open, set to -1) and unlink it."""
    if temp.fd >= 0:
        fd, temp.fd = temp.fd, -1
        try:
            os.close(fd)
        except OSError:
            pass
    temp.path.unlink(missing_ok=True)


def _pwrite_all(fd: int, data: bytes | memoryview, at: int, wrote: Callable[[int], None] | None = None) -> None:
    """All of `data` into `fd` from offset `at`, however many writes it takes
    (pwrite may write less than asked); `wrote(n)` after each."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        at += n
        view = view[n:]
        if wrote is not None:
            wrote(n)
