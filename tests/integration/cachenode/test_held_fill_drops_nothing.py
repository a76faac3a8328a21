"""A held fill's receive buffer (cachenode/fill/pace.py `Window`) on a shaped link between two network namespaces
(testkit/netns.py; root only): set without the kernel dropping what the origin was allowed to send, and, fixed
when a replica joins, bounding what the origin has ahead of the fill.

A fill held to its replica's pace stops reading its origin, and its socket's buffer is set to that pace. Cut while
the socket's advertised window was still open, the kernel pruned its queue and dropped the origin's segments; the
origin retransmitted on a timer that doubled with every drop, and once stood silent past the fill's read timeout (a
`plain` stampede at N = 8: the first owner's clients cut, no node killed). The kernel's own counters in the
receiver's namespace say whether it dropped anything; the origin's own count of what it sent says what it had
ahead. No timing is asserted.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time

import pytest

from cachenode.fill.pace import WINDOW, Window
from testkit.netns import Host, Network, NetnsUnavailable, check_available
from testkit.tools import unavailable

RATE = 10_000_000  # bytes/s each way, as bench/stampede.py's node links
PIECE = 256 * 1024  # what the fill reads each time its replica moves (fill/pace.py WINDOW)
SENDS = 64 * 1024  # the origin's send buffer, as testkit/stampede.py's origin sets it
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


class Origin:
    """A sender in `origin`'s namespace streaming to whoever connects, as fast as it is let, counting what it sent."""

    def __init__(self, net: Network) -> None:
        with net.inside("origin"):
            self._listener = socket.socket()
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SENDS)
            self._listener.bind((net.address("origin"), 0))
            self._listener.listen()
        self.where = self._listener.getsockname()
        self.sent = 0
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        self._listener.close()
        data = b"x" * PIECE
        with conn, contextlib.suppress(OSError):
            while not self._stop.is_set():
                conn.sendall(data)
                self.sent += len(data)

    def stop(self) -> None:
        self._stop.set()


def _read(sock: socket.socket, count: int) -> int:
    got = 0
    while got < count:
        got += len(sock.recv(min(1 << 20, count - got)))
    return got


def test_a_fill_held_late_has_its_buffer_lowered_without_the_kernel_dropping_a_segment(network):
    """A replica that joins once the window has grown: the buffer is lowered only as far as nothing is dropped."""
    origin = Origin(network)
    with network.inside("node"):
        sock = socket.create_connection(origin.where)
    try:
        sock.settimeout(30)
        window = Window(sock.fileno())
        got, started = 0, time.monotonic()
        while time.monotonic() - started < 1.0:  # running free: the kernel grows the window with the rate
            got += len(sock.recv(1 << 20))
        grown = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        for _ in range(12):  # held: a replica that moves a piece every half second
            window.held(got)
            time.sleep(0.5)
            got += _read(sock, PIECE)
        lowered = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    finally:
        origin.stop()
        sock.close()
    dropped = _counters(network, "node")
    assert not any(dropped.values()), f"the kernel dropped what the origin was allowed to send: {dropped}"
    assert lowered < grown, f"the buffer was never lowered to the fill's pace ({grown} bytes)"


def test_a_fill_whose_replica_joins_after_its_first_reads_keeps_its_origin_within_the_buffer_fixed_then(network):
    """A replica that joins 60 ms into the fill, when autotuning alone would have opened a window of megabytes:
    the window was kept within WINDOW meanwhile (`Window.awaiting`, before every read), so the buffer fixed at
    the join is small, and the origin has at most about twice that ahead of the held fill (queued, in flight,
    in its own send buffer)."""
    origin = Origin(network)
    with network.inside("node"):
        sock = socket.create_connection(origin.where)
    try:
        sock.settimeout(30)
        window = Window(sock.fileno())
        got, started = 0, time.monotonic()
        while time.monotonic() - started < 0.06:
            window.awaiting()
            got += len(sock.recv(1 << 20))
        window.joined()
        fixed = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        got += _read(sock, 4 * PIECE)  # the fill runs to its limit, a window past its replica
        ahead = []
        for _ in range(8):  # held: a replica that moves a piece every half second
            window.held(got)
            time.sleep(0.5)
            ahead.append(origin.sent - got)
            got += _read(sock, PIECE)
    finally:
        origin.stop()
        sock.close()
    dropped = _counters(network, "node")
    assert not any(dropped.values()), f"the kernel dropped what the origin was allowed to send: {dropped}"
    assert fixed <= 4 * WINDOW, f"fixed at {fixed} bytes: the window was let grow before the replica joined"
    assert max(ahead) <= 2 * fixed + SENDS, f"the origin ran {max(ahead)} bytes ahead of a {fixed}-byte buffer"
