"""The background scrub: every stored object re-read and checked once per
interval, at a bounded rate (issue 37 item 3; settings `scrub_interval`,
`scrub_rate`).

Why: a bit that flips on a disk is found only when something reads it.
With `--verify-reads` off, a read never checks a large object's blocks; an
object nobody reads for months would be found by nobody and copied on a
hand-off. The scrub reads each object in turn (a large one's blocks against
`Meta.blocks`, a small one's seal), removes what fails (`Store.damaged`,
counted as found by "scrub"; the next read fetches it again), and sleeps
between objects so that it reads at most `rate` bytes a second and a pass
over the store takes about `interval` seconds, whichever is slower: a
scrub must never compete with the node's own reads.

Only the writing worker scrubs (the store's owner); the checks run in the
default executor.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable

import structlog

from cachenode.store import blocks, small
from cachenode.store.objects import Meta

log = structlog.get_logger("nezha.store")


def check_file(path: str, meta: Meta) -> str | None:
    """Why the data file at `path` is not `meta`'s object, or None when it is
    (or is gone: evicted or replaced meanwhile, nothing to find). Blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot open: {e}"
    try:
        if small.is_sealed(meta):
            return None if small.check(fd, meta) else "its seal does not hold: torn or damaged"
        if os.fstat(fd).st_size != meta.size:
            return f"{os.fstat(fd).st_size} bytes on disk, {meta.size} stored"
        if meta.blocks:
            try:
                blocks.check(fd, meta.size, meta.blocks)
            except blocks.BadBlocks as e:
                return str(e)
        return None
    finally:
        os.close(fd)


class Scrub:
    """Re-reads the store's objects, one pass per `interval` seconds, at most `rate` bytes a second."""

    def __init__(self, store, *, interval: float, rate: int,
                 sleep: Callable[[float], object] = asyncio.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store  # cachenode/store/disk.py Store
        self.interval = interval
        self.rate = rate
        self._sleep = sleep
        self._clock = clock
        self.passes = 0  # passes finished, for tests and logs

    async def run(self) -> None:
        """Scrub until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            started = self._clock()
            # The records are read as the pass goes (a million objects' would hold the loop for a minute).
            total = self.store.used_bytes or 1
            checked = bad = 0
            async for meta in self.store.each_meta():
                if meta.chunk_size:
                    continue  # a chunked object's manifest: its chunks are objects of their own
                t0 = self._clock()
                why = await loop.run_in_executor(None, check_file, self.store.data_path(meta), meta)
                checked += 1
                if why is not None:
                    bad += 1
                    self.store.damaged(meta, found_by="scrub", why=why)
                # At most `rate` bytes a second, and this object's share of the interval.
                pause = max(meta.size / self.rate, self.interval * meta.size / total) - (self._clock() - t0)
                if pause > 0:
                    await self._sleep(pause)
            self.passes += 1
            log.info("scrub_pass", objects=checked, corrupt=bad, seconds=round(self._clock() - started, 3))
            rest = self.interval - (self._clock() - started)
            await self._sleep(max(rest, 0.05))
