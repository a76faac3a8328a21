"""testkit.delayline: bytes through the relay arrive whole, in order, each way a delay late, and a new
connection pays the handshake's round trip too. Times are asserted as lower bounds only (a loaded machine
makes them longer, never shorter)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from testkit import delayline
from testkit.ports import free_port
from testkit.tools import unavailable


@pytest.fixture(autouse=True)
def compiled():
    try:
        delayline.binary()
    except delayline.DelayLineUnavailable as e:
        unavailable(str(e))


@contextmanager
def echo_server() -> Iterator[tuple[int, list[int]]]:
    """Echoes each connection's bytes back; on a connection that sends b"bye", answers b"ok" and closes.
    Yields its port and the count of connections it accepted."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted = [0]

    def serve(c: socket.socket) -> None:
        with c:
            while data := c.recv(1 << 16):
                if data == b"bye":
                    c.sendall(b"ok")
                    return
                c.sendall(data)

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            accepted[0] += 1
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        srv.close()


@contextmanager
def relay(target_port: int, delay: float) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(delayline.argv(("127.0.0.1", port), ("127.0.0.1", target_port), delay),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "listening"
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def exchange(c: socket.socket, payload: bytes) -> bytes:
    c.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = c.recv(1 << 20)
        assert chunk, f"closed after {len(got)} of {len(payload)} bytes"
        got += chunk
    return got


def test_bytes_arrive_whole_and_in_order_both_ways():
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB: more than the relay reads or holds at once
    with echo_server() as (port, _), relay(port, 0.0) as through:
        with socket.create_connection(("127.0.0.1", through), timeout=30) as c:
            for _ in range(3):
                assert exchange(c, payload) == payload


def test_a_new_connection_pays_a_handshake_and_an_exchange_each_later_one_a_round_trip():
    d = 0.05
    with echo_server() as (port, accepted), relay(port, d) as through:
        t = time.monotonic()
        with socket.create_connection(("127.0.0.1", through), timeout=30) as c:
            assert exchange(c, b"ping") == b"ping"
            first = time.monotonic() - t
            t = time.monotonic()
            assert exchange(c, b"again") == b"again"
            second = time.monotonic() - t
        assert first >= 4 * d, f"connect and first answer in {first:.3f} s: the skipped handshake is not paid"
        assert second >= 2 * d, f"an answer on an open connection in {second:.3f} s"
        assert accepted[0] == 1


def test_the_servers_close_reaches_the_client_after_its_last_bytes():
    with echo_server() as (port, _), relay(port, 0.02) as through:
        with socket.create_connection(("127.0.0.1", through), timeout=30) as c:
            c.sendall(b"bye")
            assert c.recv(16) == b"ok"
            assert c.recv(16) == b""


def test_a_server_that_is_not_there_closes_the_clients_connection():
    with relay(free_port(), 0.0) as through:
        with socket.create_connection(("127.0.0.1", through), timeout=30) as c:
            c.sendall(b"hello")
            try:
                assert c.recv(16) == b""
            except ConnectionResetError:
                pass

