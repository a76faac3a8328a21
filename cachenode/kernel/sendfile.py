"""Bytes of a stored file to a client: one sendfile where it can, finishing
what the socket did not take (`sendfile_rest`), else a read loop through
TLS or a transport that cannot sendfile (`FileSender`). One place for the
byte path every writer of a stored file shares: the responder, the fast
path, chunk reads and a chunk's owner (cachenode/chunks/).
"""

from __future__ import annotations

import asyncio
import os
from typing import IO

from aiohttp import web

from cachenode.kernel.fdwait import ready
from cachenode.kernel.splice import BrokenStream, ClientGone

# Bytes read per step when a stored object goes out through TLS (encrypted in
# user space): large, since each step costs an executor hop and a drain.
TLS_CHUNK = 1 << 20


def _sendfile_now(transport: asyncio.Transport, fd: int, offset: int, count: int) -> int:
    """Bytes pushed by one os.sendfile straight to the socket, 0 if that is not safe.

    `loop.sendfile` pauses reading, swaps writers and awaits futures around
    every call; for a 100 KiB object that overhead costs more than the copy.
    When nothing is queued in the transport (the headers already left), one
    non-blocking sendfile usually sends the whole body and `loop.sendfile`
    only finishes what the socket did not take. Never on TLS transports,
    whose socket carries ciphertext.
    """
    if transport.get_write_buffer_size() or transport.get_extra_info("sslcontext") is not None:
        return 0
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return os.sendfile(sock.fileno(), fd, offset, count)
    except (BlockingIOError, InterruptedError):
        return 0


class SendCut(ConnectionError):
    """The client's socket failed during a sendfile; `sent` bytes had left."""

    def __init__(self, message: str, sent: int) -> None:
        super().__init__(message)
        self.sent = sent


async def sendfile_rest(transport: asyncio.Transport, fd: int, offset: int, count: int) -> int:
    """Bytes [offset, offset+count) of file `fd` to the transport's socket by
    sendfile(2), for any event loop; the bytes sent (fewer only if the file
    is shorter). Raises SendCut with the bytes that left when the client's
    socket fails.

    asyncio's `loop.sendfile` pauses reading and swaps the transport's
    writer around every call, and uvloop has none at all (so a node under
    uvloop cut warm hits short, docs/benchmarks.md). Here: wait until the
    transport has written what it holds (the response head), then sendfile
    on a duplicate of its socket, waiting for writability on the duplicate
    (a loop refuses readers and writers on a descriptor its transport owns).
    The transport writes nothing meanwhile: its owner is awaiting this. It
    reads nothing either (as under `loop.sendfile`): pipelined requests wait
    in the socket, not in memory, until the body is out.
    """
    sock = transport.get_extra_info("socket")
    if sock is None or transport.is_closing():
        raise SendCut("client went away", 0)
    reading = transport.is_reading()
    if reading:
        transport.pause_reading()
    out = os.dup(sock.fileno())
    sent = 0
    try:
        # What the transport holds (the head) goes first. Its writer runs on the same
        # readiness as ours: wait for the socket, not on a timer, so a client that reads
        # nothing costs nothing while it waits.
        while transport.get_write_buffer_size():
            if transport.is_closing():
                raise SendCut("client went away", 0)
            await ready(out, write=True)
            await asyncio.sleep(0)
        if transport.is_closing():
            raise SendCut("client went away", 0)
        while sent < count:
            try:
                n = os.sendfile(out, fd, offset + sent, count - sent)
            except (BlockingIOError, InterruptedError):
                await ready(out, write=True)
                continue
            except OSError as e:
                raise SendCut(f"client socket: {e}", sent) from e
            if n == 0:
                break  # the file ends here
            sent += n
        return sent
    finally:
        os.close(out)
        if reading and not transport.is_closing():
            transport.resume_reading()


class FileSender:
    """Bytes of a stored file to a client: one sendfile where it can, else a
    read loop. One object for every writer of a stored file (the responder,
    chunk reads and a chunk's owner, cachenode/chunks/), built before them."""

    def __init__(self, *, sendfile: bool, read_size: int) -> None:
        self._sendfile = sendfile
        self._read_size = read_size

    async def __call__(self, request: web.Request, resp: web.StreamResponse, f: IO[bytes],
                       offset: int, count: int) -> None:
        """Bytes [offset, offset+count) of `f` to the client, by sendfile when possible.

        Raises ClientGone, with the bytes that did leave, when the client hung up.
        """
        done = 0
        try:
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("client went away")
            # Not on TLS: asyncio's sendfile "fallback" there copies 16 KiB per executor hop (about
            # 200 MB/s measured, bench/tls.py); the loop below moves TLS_CHUNK at a time.
            tls = transport.get_extra_info("sslcontext") is not None
            if self._sendfile and not tls and resp.chunked is False and not resp.compression:
                done = _sendfile_now(transport, f.fileno(), offset, count)
                if done == count:
                    return
                try:
                    sent = await sendfile_rest(transport, f.fileno(), offset + done, count - done)
                except SendCut as e:
                    done += e.sent
                    raise
                else:
                    if sent != count - done:
                        raise BrokenStream(f"sent {done + sent} of {count} bytes")
                    return
            loop = asyncio.get_running_loop()
            chunk = max(self._read_size, TLS_CHUNK) if tls else self._read_size
            while done < count:
                data = await loop.run_in_executor(None, os.pread, f.fileno(), min(chunk, count - done), offset + done)
                if not data:
                    raise BrokenStream(f"file ended {count - done} bytes early")
                await resp.write(data)
                done += len(data)
        except ConnectionError as e:
            sent = max(0, min(done, count))
            raise ClientGone(f"client went away after {sent} bytes", sent=sent) from e
