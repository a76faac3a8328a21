"""The splice relay owns its upstream socket: nothing else may read from it."""

import asyncio
import socket

from cachenode.kernel.splice import _take


async def test_a_taken_transport_stays_paused_when_a_stale_reader_resumes_it():
    """A previous response's reader on a pooled connection may call resume_reading()
    mid-splice; the bytes must stay on the socket for the splice, not go to aiohttp."""
    ours, theirs = socket.socketpair()
    received = []

    class Recorder(asyncio.Protocol):
        def data_received(self, data):
            received.append(data)

    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(Recorder, ours)
    try:
        _take(transport)
        transport.resume_reading()  # what the stale reader does
        theirs.sendall(b"body bytes")
        await asyncio.sleep(0.05)
        assert received == [] and not transport.is_reading()
        ours.setblocking(False)
        assert ours.recv(100) == b"body bytes"
    finally:
        transport.close()
        theirs.close()
