"""Start writing a fill's pages to disk while the fill is still running.

A commit fsyncs the whole temp file before renaming it (cachenode/store/disk.py).
Linux starts writing a file's dirty pages on its own only when the machine's
dirty pages pass dirty_background_ratio (gigabytes on a node with the memory
of one that caches datasets) or when they are 30 s old, so before this the
commit's fsync wrote the whole object at the end: 0.27 s of a 1 GiB
node-to-node copy that took 0.7 s here, with the network idle meanwhile.

sync_file_range(SYNC_FILE_RANGE_WRITE) asks the kernel to start writing
a range's dirty pages and returns without waiting for them, so the disk
writes behind the fill and the fsync finds only the last few megabytes.
It is advice: it guarantees nothing (the fsync does), so a platform without
it, or a call that fails, changes only how long the commit takes. The pages
stay in the page cache, clean, for the readers of a growing file.

The request can block while the disk's queue is full, so it is never made
by a writer: one thread makes them all, on a duplicate of the file's
descriptor (the fill may close its own meanwhile), and a file with a
request still waiting asks for no other. On a disk slower than the
network, fills then go on at the network's pace, as before, instead of
waiting for the disk at each step.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

# Bytes written between two requests: 64 per GiB, each a walk of the
# file's dirty pages.
STEP = 16 << 20

_KICKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nezha-writeback")

_WRITE = 2  # SYNC_FILE_RANGE_WRITE, <linux/fs.h>


def _bind():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _bind()


def available() -> bool:
    return _sync_file_range is not None


def start(fd: int) -> bool:
    """Ask the kernel to start writing `fd`'s dirty pages, without waiting
    for them; whether it took the request (never raises)."""
    if _sync_file_range is None:
        return False
    return _sync_file_range(fd, 0, 0, _WRITE) == 0  # length 0: to the end of the file


def drain() -> None:
    """Block until every request asked for so far has been made (for tests)."""
    _KICKER.submit(lambda: None).result()


class WriteBehind:
    """Counts what the writers of one file wrote, from any thread, and asks
    for writeback of the whole file each time the total passes a multiple
    of `step` (once per write however many it passes: one request covers
    all), unless the last request is still waiting to be made.

    The whole file rather than the range just written: a parallel fill's
    ranges land all over it, and pages already clean or under writeback are
    skipped. `wrote` is called only from within a write to `fd`, so `fd` is
    open while it is duplicated for the request.
    """

    def __init__(self, fd: int, *, step: int | None = None) -> None:
        self.fd = fd
        self.step = step or STEP
        self.pending = 0
        self.kicks = 0  # requests handed to the writeback thread
        self._waiting = False
        self._lock = threading.Lock()

    def wrote(self, n: int) -> None:
        """Never raises: it runs inside a fill's writes, which must not fail for advice."""
        with self._lock:
            self.pending += n
            if self.pending < self.step or self._waiting:
                return
            self.pending %= self.step
            self._waiting = True
        fd = -1
        try:
            fd = os.dup(self.fd)
            _KICKER.submit(self._kick, fd)
        except (OSError, RuntimeError):
            # No descriptor left, or the thread is gone (the interpreter is
            # exiting): the fsync will do it all.
            if fd >= 0:
                os.close(fd)
            with self._lock:
                self._waiting = False
            return
        with self._lock:
            self.kicks += 1

    def _kick(self, fd: int) -> None:
        try:
            start(fd)
        finally:
            os.close(fd)
            with self._lock:
                self._waiting = False
