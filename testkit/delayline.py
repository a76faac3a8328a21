"""A distance in front of a server: every byte through the relay arrives `delay` seconds late, each way.

An origin a training job reads (S3, GCS, the Hugging Face hub, a web host)
answers a small GET tens of milliseconds after it is asked; nginx on
loopback answers in microseconds, and a cache measured against that
measures nothing but its own CPU. The way to put a network between them
would be a `netem` queue on the origin's link (testkit/netns.py), but this
machine's kernel has none (CONFIG_NET_SCH_NETEM is not set, no modules).
So the delay is a relay in front of the origin, delayline.c: it accepts a
connection, connects to the server, and holds every chunk it reads for
`delay` before writing it on, in order, in both directions. A new
connection's first bytes are also held until a TCP handshake over that
distance would have finished (its SYN and SYN-ACK: one more round trip),
so a client that opens a connection per request pays what it would pay.

What it is not: packet loss, jitter or a rate limit (give the host a rate
in testkit/netns.py for that); TCP's slow start across the distance (the
relay's own sockets are local on each side), so a large answer arrives
faster than across a real link of that round trip. For small objects (one
or a few packets) the round trips are the cost, and those it keeps.

Written in C because the relay must not be what is measured: at thousands
of requests a second an event loop in Python would take a core of a
two-core machine. It is compiled on first use with the system's cc into
a folder keyed by its source's hash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("delayline.c")


class DelayLineUnavailable(Exception):
    """No C compiler to build the relay with."""


def binary() -> Path:
    """The compiled relay, built once per version of its source."""
    code = SOURCE.read_bytes()
    where = Path(tempfile.gettempdir()) / f"nezha-delayline-{hashlib.sha256(code).hexdigest()[:12]}"
    exe = where / "delayline"
    if exe.exists():
        return exe
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise DelayLineUnavailable("no C compiler (cc) to build testkit/delayline.c: apt-get install -y gcc")
    where.mkdir(parents=True, exist_ok=True)
    part = where / f"delayline.{os.getpid()}"
    done = subprocess.run([cc, "-O2", "-Wall", "-o", str(part), str(SOURCE)], capture_output=True, text=True)
    if done.returncode != 0:
        raise DelayLineUnavailable(f"cc failed on {SOURCE}: {done.stderr.strip()[-500:]}")
    part.replace(exe)  # whole or not there: two builds at once both succeed
    return exe


def argv(listen: tuple[str, int], target: tuple[str, int], delay: float) -> list[str]:
    """The relay's command line: listen on `listen`, pass to `target`, `delay` seconds each way.
    It prints `listening` once it accepts."""
    if delay < 0:
        raise ValueError(f"a delay of {delay!r} s: it must be 0 or more")
    return [str(binary()), listen[0], str(listen[1]), target[0], str(target[1]), str(round(delay * 1e6))]
