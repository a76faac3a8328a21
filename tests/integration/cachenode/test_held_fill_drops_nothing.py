"""A held fill's receive buffer lowered without dropping what its origin was allowed to send (cachenode/fill/pace.py
`Window`), on a shaped link between two network namespaces (testkit/netns.py; root only).

A fill held to its replica's pace stops reading its origin, and its socket's buffer is capped to that pace. Cut
while the socket's advertised window was still open, the kernel pruned its queue and dropped the origin's
segments; the origin retransmitted on a timer that doubled with every drop, and once stood silent past the
fill's read timeout (a `plain` stampede at N = 8: the first owner's clients cut, no node killed). The
kernel's own counters in the receiver's namespace say whether it dropped anything: no timing is asserted.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time

import pytest

from cachenode.fill.pace import Window
from testkit.netns import Host, Network, NetnsUnavailable, check_available
from testkit.tools import unavailable

RATE = 10_000_000  # bytes/s each way, as bench/stampede.py's node links
PIECE = 256 * 1024  # what the fill reads each time its replica moves (fill/pace.py WINDOW)
DROPPED = ("TcpExtRcvPruned", "TcpExtOfoPruned", "TcpExtTCPRcvQDrop")


@pytest.fixture
def network():
    try:
        check_available()
    except NetnsUnavailable as e:
        unavailable(str(e))
    with Network([Host("origin", RATE), Host("node", RATE)]) as net:
        yield net


def _counters(net: Network, host: str) -> dict[str, int]:
    out = subprocess.run(net.argv(host, "nstat", "-az", *DROPPED), capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: int(line.split()[1]) for line in out.splitlines() if line and not line.startswith("#")}


def _origin(net: Network, stop: threading.Event) -> tuple[str, int]:
    """A sender in `origin`'s namespace streaming to whoever connects, as fast as it is let; its address."""
    with net.inside("origin"):
        listener = socket.create_server((net.address("origin"), 0))
    where = listener.getsockname()

    def serve() -> None:
        conn, _ = listener.accept()
        listener.close()
        data = b"x" * PIECE
        with conn, contextlib.suppress(OSError):
            while not stop.is_set():
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return where


def test_a_held_fill_has_its_buffer_lowered_without_the_kernel_dropping_a_segment(network):
    stop = threading.Event()
    where = _origin(network, stop)
    with network.inside("node"):
        sock = socket.create_connection(where)
    try:
        sock.settimeout(30)
        window = Window(sock.fileno(), shut_first=True)  # as a spliced fill (`HeldBody`) makes it
        got, started = 0, time.monotonic()
        while time.monotonic() - started < 1.0:  # running free: the kernel grows the window with the rate
            got += len(sock.recv(1 << 20))
        grown = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        for _ in range(12):  # held: a replica that moves a piece every half second
            window.held(got)
            held = time.monotonic()
            while time.monotonic() - held < 0.5:
                window.shut()
                time.sleep(0.05)
            want = PIECE
            while want:
                n = len(sock.recv(want))
                got, want = got + n, want - n
        lowered = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    finally:
        stop.set()
        sock.close()
    assert lowered < grown, f"the buffer was never lowered to the fill's pace ({grown} bytes)"
    dropped = _counters(network, "node")
    assert not any(dropped.values()), f"the kernel dropped what the origin was allowed to send: {dropped}"
