"""Group durability: small objects made durable together, by one `syncfs` per interval.

A small object is committed without an fsync of its own (cachenode/store/
sealed.py says why that is safe: its checksum tells a torn file apart).
What bounds how much a power loss can take is this: every `interval`
seconds in which anything was committed, one syncfs(2) of the store's file
system writes every dirty page at once, one thread hand-off for the whole
batch instead of two fsyncs per object. A node that stops (SIGTERM) syncs
once more before it exits, so a clean stop loses nothing.

What a crash can cost: the small objects committed in the last interval
(and the sync under way). Each is then missing or fails its checksum at
start-up, and is fetched again by the next request for it; none is served
torn. syncfs needs Linux; elsewhere (or if the call fails) the sync falls
back to sync(2), which is the same promise for the whole machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
from pathlib import Path
from typing import Callable

import structlog

log = structlog.get_logger("nezha.store")

# Seconds between two group syncs: what a power loss may cost, at most, of small objects.
SYNC_INTERVAL = 1.0


def _bind_syncfs() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = _bind_syncfs()


def sync_filesystem(path: Path) -> None:
    """Write every dirty page of the file system holding `path` to disk (blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _SYNCFS is None or _SYNCFS(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


class GroupSync:
    """Commits since the last sync, and the task that syncs them every `interval`."""

    def __init__(self, root: Path, *, interval: float = SYNC_INTERVAL,
                 sync: Callable[[Path], None] = sync_filesystem) -> None:
        self.root = root
        self.interval = interval
        self._sync = sync
        self._dirty = 0  # commits not yet covered by a sync that has started
        self._task: asyncio.Task | None = None
        self._running: asyncio.Future | None = None
        self.syncs = 0  # syncs done, for tests and the log

    def committed(self) -> None:
        """One more object awaits the next sync; starts the syncing task on first use."""
        self._dirty += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    @property
    def pending(self) -> int:
        return self._dirty

    async def _loop(self) -> None:
        while self._dirty:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        """Sync now whatever was committed before this call (waits for a sync under way first)."""
        while self._running is not None:
            with contextlib.suppress(OSError):  # its own caller logs it
                await asyncio.shield(self._running)
        if not self._dirty:
            return
        batch, self._dirty = self._dirty, 0
        self._running = asyncio.get_running_loop().run_in_executor(None, self._sync, self.root)
        try:
            await asyncio.shield(self._running)
        except OSError as e:
            self._dirty += batch  # try again with the next batch
            log.warning("group_sync_failed", root=str(self.root), objects=batch, error=str(e))
            return
        finally:
            self._running = None
        self.syncs += 1

    async def close(self) -> None:
        """The last sync, for a node that stops: nothing committed is left to chance."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()
