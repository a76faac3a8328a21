"""A link between two processes of one node: records, with file descriptors.

The supervisor makes each link as a socketpair (AF_UNIX, SOCK_SEQPACKET) and
gives one end to each side, so no path on disk or name in the pod's network
namespace lets any other process join. SEQPACKET keeps record boundaries
and delivers the descriptors sent with a record together with that record,
which is what handing a client's connection to another worker needs.

A record is a typed message and optional raw bytes after it
(cachenode/workers/messages.py, the one encoder and decoder). Records larger than `MAX_RECORD` are the
sender's to split (a connection's bytes read so far go as continuations).
Sending never blocks the event loop: what the socket does not take waits in
order, with the descriptors it carries kept open until it is sent.
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
from collections import deque
from typing import Callable

import structlog

from cachenode.workers.messages import Message, Unknown, decode, encode

log = structlog.get_logger("nezha.workers")

MAX_RECORD = 60 * 1024
RECORD_LIMIT = MAX_RECORD + 4096  # a record's bytes at most, its head included: a larger one is refused
# Records waiting for a peer that reads nothing: beyond this the peer is
# taken for stuck and the link is closed (a follower then exits and is
# started again with a fresh copy of the index), rather than holding memory
# without bound for it.
MAX_QUEUED = 100_000
_MAX_FDS = 4


class Channel:
    """One end of a link, driven by the running event loop.

    `on_record(message, tail, fds)` gets every record in order (it owns the
    fds; a tag it does not know comes as `Unknown`); `on_closed()` is called
    once when the other side is gone."""

    def __init__(self, sock: socket.socket, *, on_record: Callable[[Message | Unknown, bytes, list[int]], None],
                 on_closed: Callable[[], None]) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._on_record = on_record
        self._on_closed = on_closed
        self._out: deque[tuple[bytes, list[int]]] = deque()
        self._loop = asyncio.get_running_loop()
        self._writing = False
        self.closed = False
        self._loop.add_reader(sock.fileno(), self._readable)

    def send(self, message: Message, tail: bytes = b"", fds: tuple[int, ...] = ()) -> None:
        """Queue a record; `fds` are the channel's to close once sent (pass dups)."""
        record = encode(message, tail)
        if len(record) > RECORD_LIMIT:
            raise ValueError(f"record of {len(record)} bytes: split it below {MAX_RECORD}")
        if self.closed:
            for fd in fds:
                os.close(fd)
            return
        self._out.append((record, list(fds)))
        if len(self._out) > MAX_QUEUED:
            log.error("worker_link_stuck", queued=len(self._out), reason="the other side reads nothing: link closed")
            self.close()
            return
        if not self._writing:
            self._flush()

    @property
    def queued(self) -> int:
        return len(self._out)

    def _flush(self) -> None:
        while self._out:
            record, fds = self._out[0]
            try:
                if fds:
                    self.sock.sendmsg([record], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                else:
                    self.sock.send(record)
            except (BlockingIOError, InterruptedError):
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self.sock.fileno(), self._flush)
                return
            except OSError:
                self.close()
                return
            self._out.popleft()
            for fd in fds:
                os.close(fd)
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        while not self.closed:
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(
                    RECORD_LIMIT, socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            fds: list[int] = []
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[:len(payload) - len(payload) % got.itemsize])
                    fds.extend(got)
            if not data:
                for fd in fds:
                    os.close(fd)
                self.close()
                return
            try:
                message, tail = decode(data)
            except ValueError as e:
                for fd in fds:
                    os.close(fd)
                log.error("worker_record_malformed", error=str(e), bytes=len(data))
                continue
            self._on_record(message, tail, fds)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self.sock.fileno())
        if self._writing:
            self._loop.remove_writer(self.sock.fileno())
        for _, fds in self._out:
            for fd in fds:
                os.close(fd)
        self._out.clear()
        self.sock.close()
        self._on_closed()
