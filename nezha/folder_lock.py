"""One process per data folder: an exclusive lock on a file inside it.

Two nodes on one folder each keep their own index of what is on its disk
and apply their own capacity to it; downloads stay correct (a missing
object file is refetched), capacity and counts do not. Two `nezha up` on
one folder share its node folders, its embedded index and its settings
file. So a node (`nezha cache`) and `nezha up` each hold `flock(2)` on
LOCK_NAME in their folder for as long as they run, and a second one on the
same folder is refused before it starts anything, naming the folder and
the process that holds it.

flock, not a pid file: the kernel drops the lock when the last descriptor
of it closes, however the process ends (SIGKILL included), so a stale lock
never needs cleaning. The descriptor survives exec (the supervisor of a
node's workers, cachenode/workers/supervisor.py, is exec'd into with it)
and is shared by the children it is passed to, which is how a node's
workers run on the folder their supervisor holds. The file's text is the
holder's pid and command, written after the lock is taken: for the error
message only, never trusted for the lock itself.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from nezha.errors import RunError

LOCK_NAME = ".nezha.lock"


def hold(folder: Path, *, command: str, flag: str = "--data-dir") -> int:
    """Lock `folder` for this process; the descriptor holding it (keep it open).

    RunError naming `flag`, the folder and the holder's pid and command
    when another process holds it. `command` is written for that message
    ("nezha cache", "nezha up")."""
    path = Path(folder) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RunError(f"{flag} {str(folder)!r}: cannot open its lock file {LOCK_NAME}: "
                       f"{e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunError(f"{flag} {str(folder)!r} is in use by {holder}: one node per data folder; stop it, or "
                       f"give this one a folder of its own") from None
    except OSError as e:
        os.close(fd)
        raise RunError(f"{flag} {str(folder)!r}: cannot lock {LOCK_NAME}: {e.strerror or e}") from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    """"pid 1234 (nezha cache)" from the lock file's text, or "another process"
    when it holds none yet (the holder locks first, then writes)."""
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    pid, _, command = text.partition(" ")
    if not pid.isdigit():
        return "another process"
    return f"pid {pid} ({command})" if command else f"pid {pid}"
