#!/usr/bin/env python3
"""The least a cold fill can cost on this machine: a reference, not a cache.

bench/throughput.py measures the cache's cold fill against a direct download
(cold_fast). A cold fill does more than a direct download by its nature: it
writes the object into a file and sends it on from there, so the machine
moves every byte twice. This relay does exactly that and nothing else: for
each GET, one thread moves the origin's body socket -> pipe -> file by
blocking splice(2), as the cache node's fills do (cachenode/kernel/splice.py), and
the main thread sends the growing file to the client by sendfile(2), as the
node's readers do. No HTTP framework, no event loop, no store, no commit;
one request at a time. What it reaches is the ceiling for any cache that
writes what it serves, on this machine, and the node's figure is read
against it.

    python bench/bare_relay.py --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT --dir DIR

Answers 502 with a reason when the origin's answer is not a 200 with a
Content-Length; prints "listening" once it accepts connections.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import struct
import sys
import threading
from pathlib import Path

PIPE = 1 << 20
SILENCE = 30  # seconds an origin may send nothing mid-body before the transfer is given up
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class Refused(Exception):
    """The origin's answer is not one this relay handles."""


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise Refused("connection closed before the end of the head")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def field(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


class Growing:
    """How much of the file is written, shared by the pump and the sender."""

    def __init__(self, written: int) -> None:
        self.written = written
        self.error: BaseException | None = None
        self.cond = threading.Condition()

    def moved(self, written: int) -> None:
        with self.cond:
            self.written = written
            self.cond.notify()

    def failed(self, error: BaseException) -> None:
        with self.cond:
            self.error = error
            self.cond.notify()

    def beyond(self, offset: int) -> int:
        with self.cond:
            while self.written <= offset and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise self.error
            return self.written


def pump(origin: socket.socket, fd: int, start: int, length: int, growing: Growing) -> None:
    try:
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, PIPE)
            pos = start
            while pos < length:
                n = os.splice(origin.fileno(), w, min(PIPE, length - pos))
                if n == 0:
                    raise Refused(f"origin closed at {pos} of {length} bytes")
                while n:
                    m = os.splice(r, fd, n, offset_dst=pos)
                    if m == 0:
                        raise Refused(f"the file took no bytes at {pos}")
                    n -= m
                    pos += m
                growing.moved(pos)
        finally:
            os.close(r)
            os.close(w)
    except BaseException as e:  # the sender must learn it, not wait forever
        growing.failed(e)


class Answered(Exception):
    """A failure after the head was sent: the client can only be cut off."""


def relay(client: socket.socket, upstream: tuple[str, int], folder: Path) -> None:
    head, _ = read_head(client)
    method, target = head.split(b" ")[:2]
    if method != b"GET":
        raise Refused(f"{method.decode()} is not relayed")
    host = field(head, b"host") or b"localhost"
    with socket.create_connection(upstream, timeout=SILENCE) as origin:
        origin.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        answer, body = read_head(origin)
        length = field(answer, b"content-length")
        status = answer.split(b"\r\n")[0].decode(errors="replace")
        if not status.startswith("HTTP/1.1 200") or length is None:
            raise Refused(f"origin answered {status!r}; only a 200 with a Content-Length is relayed")
        size = int(length)
        # Blocking from here, for splice, with the kernel's own receive
        # timeout (splice then fails with EAGAIN) instead of Python's.
        origin.settimeout(None)
        origin.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", SILENCE, 0))
        body = body[:size]
        path = folder / f"relay-{os.getpid()}.part"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body)
            growing = Growing(len(body))
            thread = threading.Thread(target=pump, args=(origin, fd, len(body), size, growing))
            thread.start()
            try:
                client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
                sent = 0
                try:
                    while sent < size:
                        ready = growing.beyond(sent)
                        while sent < ready:
                            sent += os.sendfile(client.fileno(), fd, sent, ready - sent)
                except (Refused, OSError) as e:
                    origin.shutdown(socket.SHUT_RDWR)  # the pump stops at once, not at the body's end
                    raise Answered(f"cut off at {sent} of {size} bytes: {e}") from e
            finally:
                thread.join()
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="host:port to accept on")
    parser.add_argument("--upstream", required=True, help="the origin's host:port")
    parser.add_argument("--dir", required=True, type=Path, help="where the file of each transfer is written")
    args = parser.parse_args(argv)
    server = socket.create_server(address(args.listen), reuse_port=False)
    print("listening", flush=True)
    while True:
        client, _ = server.accept()
        with client:
            try:
                relay(client, address(args.upstream), args.dir)
            except Answered as e:
                print(f"relay failed: {e}", file=sys.stderr, flush=True)
            except Exception as e:  # a malformed head or length: this request fails, not the relay
                print(f"relay failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                reason = str(e).encode()
                try:
                    client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                                   % (len(reason), reason))
                except OSError:
                    pass


if __name__ == "__main__":
    sys.exit(main())
