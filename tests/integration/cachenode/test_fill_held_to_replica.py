"""A fill kept within a window of its replica's copy (cachenode/fill/pace.py), on 127.0.0.1.

The key's second owner reads the first owner's fill slowly (a streaming copy behind a busy link does): the
fill reads its origin no further ahead of it than a window and the socket buffers capped for it, so a leader
killed mid-fill leaves little for the replica's resume to fetch again. A replica that stops reading holds
the fill STALL at most: the fill lands and the owner's own client gets every byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time

import pytest
from aiohttp import web

from cachenode.fill.pace import STALL
from tests.integration.cachenode.conftest import HOST, key_of, until
from tests.support_pace import every_wait_ends

MiB = 1 << 20
PATH = "/datasets/held/shard-0.tar"
BODY = os.urandom(48 * MiB)


class CountingOrigin:
    """Sends the body as fast as its reader takes it, through a small send buffer, counting each byte sent."""

    def __init__(self) -> None:
        self.sent = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"ETag": '"held-1"', "Cache-Control": "max-age=3600",
                                           "Accept-Ranges": "bytes"})
        resp.content_length = len(BODY)
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for at in range(0, len(BODY), 64 * 1024):
                await resp.write(BODY[at:at + 64 * 1024])
                self.sent += min(64 * 1024, len(BODY) - at)
            await resp.write_eof()
        return resp


@pytest.fixture
async def counting_origin():
    origin = CountingOrigin()
    app = web.Application()
    app.router.add_get("/{tail:.*}", origin.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # what it counts as sent has nearly left it
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    origin.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield origin
    await runner.cleanup()


class Replica:
    """The key's second owner reading the first owner's fill as a peer, through a small receive buffer, at
    the pace the test sets."""

    def __init__(self, url: str, peer_id: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.sock.connect((host, int(port)))
        self.sock.setblocking(False)
        self.sock.sendall(f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\nX-Nezha-Peer: {peer_id}\r\n\r\n".encode())
        self.got = 0  # body bytes
        self._head = b""

    async def read(self, upto: int, *, rate: float) -> None:
        loop = asyncio.get_running_loop()
        started, at_start = time.monotonic(), self.got
        while self.got < upto:
            data = await loop.sock_recv(self.sock, 64 * 1024)
            assert data, "the owner closed"
            if self._head is not None:
                self._head += data
                if b"\r\n\r\n" not in self._head:
                    continue
                head, data = self._head.split(b"\r\n\r\n", 1)
                assert head.startswith(b"HTTP/1.1 200"), head
                self._head = None
            self.got += len(data)
            await asyncio.sleep(max(0.0, started + (self.got - at_start) / rate - time.monotonic()))

    def close(self) -> None:
        self.sock.close()


async def test_a_fill_reads_its_origin_no_further_ahead_of_a_slow_replica_than_its_window_and_buffers(
        counting_origin, cluster, session):
    nodes, _ = await _two(cluster, counting_origin)
    first, second = (p.id for p in next(iter(nodes.values())).node.cluster.owners(key_of(PATH), 2))
    # What the owner handed its socket toward the replica reaches it whatever befalls the owner; on 127.0.0.1
    # the kernel grows that send buffer up to tcp_wmem's largest.
    send_buffer = int(open("/proc/sys/net/ipv4/tcp_wmem").read().split()[2])
    replica = Replica(nodes[first].url, second)
    try:
        await replica.read(2 * MiB, rate=4 * MiB)
        for _ in range(4):  # at 4 MiB/s, for a second: the origin could send it all in a fraction of that
            await replica.read(replica.got + MiB, rate=4 * MiB)
            ahead = counting_origin.sent - replica.got
            assert ahead <= send_buffer + 2 * MiB, f"the origin sent {ahead} bytes past the replica's copy"
    finally:
        replica.close()


async def test_a_replica_that_stops_reading_holds_the_fill_stall_at_most(
        counting_origin, cluster, session, monkeypatch):
    """Every wait on the fill's pace ended by a peer moving or by its STALL timer, and the fill went free with
    its HOLD budget left: released because the still replica went stale, not because HOLD ran out. What is
    recorded is which timer ended each wait, not how long a loaded machine took to run it."""
    nodes, _ = await _two(cluster, counting_origin)
    first, second = (p.id for p in next(iter(nodes.values())).node.cluster.owners(key_of(PATH), 2))
    # Recorded from before the replica reads: the wait that its last move starts, the one it then holds
    # the fill in, may begin before its read returns.
    ended, paces = every_wait_ends(monkeypatch)
    replica = Replica(nodes[first].url, second)
    try:
        await replica.read(MiB, rate=8 * MiB)  # then it reads nothing more, its connection open
        status, _, body = await nodes[first].get(session, PATH)
        assert (status, hashlib.sha256(body).digest()) == (200, hashlib.sha256(BODY).digest())
        await until(lambda: nodes[first].node.store.lookup(key_of(PATH)) is not None, timeout=60)
        assert ("timer", STALL) in ended, "the still replica held the fill (or its client) one STALL"
        assert set(ended) <= {("timer", STALL), ("moved", STALL)}, ended
        assert paces and all(p._budget > 0 for p in paces), "released by the replica going stale, not HOLD"
    finally:
        replica.close()


async def _two(cluster, origin):
    from nezha.config import Origin

    return await cluster(2, replicas=2, origins=[Origin(host=HOST, upstream=origin.url)])
