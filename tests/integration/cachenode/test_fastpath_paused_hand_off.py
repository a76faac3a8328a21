"""A connection the fast path hands to aiohttp while its writing is paused
(front/fastpath.py `FastPath._hand_off`): aiohttp's protocol is told it is
paused, so it waits for the client to read before writing more, and the
transport's later `resume_writing` finds it paused, as aiohttp asserts.

The way there: a miss the fast path leads, whose origin sends interim
answers (103) faster than the client reads them, so the node's writing to
that client pauses; the final answer then streams (too large to store at
once), which the fast path hands to the handler with the connection."""

from __future__ import annotations

import asyncio
import hashlib
import socket

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST

HINT = b"HTTP/1.1 103 Early Hints\r\nLink: <" + b"a" * 8000 + b">; rel=preload\r\n\r\n"
HINTS = 512  # 4 MiB of interim answers: more than the kernel's buffers on both sides and the transport's
BODY = hashlib.sha256(b"paused").digest() * (2 * 1024 * 1024 // 32)  # 2 MiB: streams, never stored at once


class HintingOrigin:
    """An origin that sends HINTS interim answers, then a 200 with BODY."""

    def __init__(self) -> None:
        self.sent = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for _ in range(HINTS):
            writer.write(HINT)
            await writer.drain()
        writer.write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=3600\r\nContent-Length: %d\r\n\r\n" % len(BODY))
        writer.write(BODY)
        await writer.drain()
        self.sent.set()
        await reader.read()  # until the node lets the connection go
        writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_connection_handed_over_while_its_writes_are_paused_gets_its_answer_whole(make_node):
    origin = HintingOrigin()
    url = await origin.start()
    loop = asyncio.get_running_loop()
    faults: list[dict] = []
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: faults.append(context))
    try:
        node = await make_node(origins=[Origin(host=HOST, upstream=url)])
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader's small window
        client.setblocking(False)
        await loop.sock_connect(client, ("127.0.0.1", node.server.port))
        await loop.sock_sendall(client, f"GET /big HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        # Nothing is read until the origin has sent everything and the fill has
        # landed: the 103s back up, the node pauses writing to this client,
        # and the streaming answer's hand-off happens under that pause.
        await asyncio.wait_for(origin.sent.wait(), 60)
        await node.node.settled()
        received = bytearray()
        while len(received) < HINTS * len(HINT) + len(BODY) or b"\r\n\r\n" not in received[HINTS * len(HINT):]:
            chunk = await asyncio.wait_for(loop.sock_recv(client, 1 << 16), 60)
            assert chunk, f"the node closed the connection after {len(received)} bytes"
            received += chunk
            if b"\r\n\r\n" in received[HINTS * len(HINT):]:
                head = received[HINTS * len(HINT):].split(b"\r\n\r\n")[0]
                if len(received) >= HINTS * len(HINT) + len(head) + 4 + len(BODY):
                    break
        client.close()
    finally:
        loop.set_exception_handler(before)
        await origin.close()
    assert not faults, f"the event loop reported: {[c.get('message') for c in faults]} {faults[0].get('exception')!r}"
    hints, final = received[:HINTS * len(HINT)], received[HINTS * len(HINT):]
    assert bytes(hints) == HINT * HINTS, "every interim answer, whole and in order"
    head, _, body = bytes(final).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == BODY, f"the streamed answer whole: {len(body)} of {len(BODY)} bytes"
