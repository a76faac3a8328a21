"""Servers a command starts on this machine for itself: free ports on 127.0.0.1,
waiting for one to listen, and children that do not outlive their parent.

`nezha up` and `nezha demo` start node processes (nezha/dev/local_cluster.py)
and an embedded redis-server (nezha/index/embedded.py); the tests and
benchmarks start servers the same way (testkit/ports.py re-exports these).
One copy here, in the shipped package, so the three cannot drift apart.

A port is free when asked, and another process may take it before the
server binds it: callers that can bind port 0 and read back what they got
should; these are for servers that must be told their port.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

HOST = "127.0.0.1"
_random = random.Random()  # its own: tests that seed the global one would be handed the same ports


# Ports handed out lie below the kernel's ephemeral range: a port in it that
# is free when asked can be taken as the source port of any outgoing
# connection before the server binds it (a node started a second later lost
# its port so, "address already in use", in a full test run).
_LOWEST = 20000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = HOST) -> int:
    """A port nothing listens on at `host` right now, below the ephemeral
    range when there is room there (else one the kernel picks)."""
    low = _ephemeral_low()
    if low - _LOWEST >= 1000:
        for _ in range(200):
            port = _random.randrange(_LOWEST, low)
            if is_free(port, host):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_free(port: int, host: str = HOST) -> bool:
    """True when `port` can be bound at `host` now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_run(n: int, host: str = HOST, *, tries: int = 50) -> int:
    """A base port with `n` free ports from it on (node i listens on base + i)."""
    low = _ephemeral_low()
    for _ in range(tries):
        base = free_port(host)
        if base + n <= (low if base < low else 65536) and all(is_free(port, host) for port in range(base, base + n)):
            return base
    raise RuntimeError(f"no run of {n} free ports on {host} in {tries} tries")


async def wait_listening(port: int, proc: subprocess.Popen, *, timeout: float, host: str = HOST) -> bool:
    """True once host:port accepts a connection; False if `proc` exits first or `timeout` passes."""
    import asyncio  # here: the workers' supervisor imports this module for die_with_parent, and no event loop

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        return True
    return False


# Linux's prctl(2), looked up in the parent: a child between fork and exec
# should call it, not load libraries (another thread may hold the loader's lock).
_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        _prctl = None


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets `sig` when this process dies,
    however it dies (SIGKILL included), so a server it started never serves on alone.

    Linux only (PR_SET_PDEATHSIG; None elsewhere). The signal follows the
    *thread* that started the child: call Popen from a thread that lives as
    long as the child should (the event loop's), never from a short-lived
    executor thread.
    """
    if _prctl is None:
        return None
    parent = os.getpid()
    prctl = _prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call above: no signal would come
            os.kill(os.getpid(), sig)

    return preexec
