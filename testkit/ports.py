"""Free TCP ports on 127.0.0.1, for servers that must be told their port.

A server that can bind port 0 and report what it got should do that
instead; these are for processes that take `--listen HOST:PORT` or a base
port. A port is free when asked, and another process may take it before
the server binds it: the window is small, and a test that loses it fails
naming the port rather than passing by accident.
"""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A port nothing listens on at `host` right now."""
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
    """A base port with `n` free ports from it on, for `nezha up --base-port`
    (node i listens on base + i)."""
    for _ in range(tries):
        base = free_port(host)
        if base + n <= 65536 and all(is_free(port, host) for port in range(base, base + n)):
            return base
    raise RuntimeError(f"no run of {n} free ports on {host} in {tries} tries")
