"""A chunked object's whole body checked against the origin's digest of the
object as the reading node assembles it for a client (docs/cache-node.md,
"Verified bytes").

Each chunk is filled from the origin by a Range request, whose answer
carries no digest of the whole, and is checked against its own block
checksums when copied; nothing else ties the chunks to what the origin
published. The one place the whole object passes in order is a client's
read of all of it, so there it is hashed (`fill/streamed_digest.py`), and
its last byte is held until the hash matches: on a mismatch the client is
cut (no clean end), the event logged and counted as a fill's is, and the
manifest and every chunk of the object are forgotten on every node, so the
next read fetches the object again. Such a read's bytes pass through
Python (a stored chunk read by `pread` in a thread, a peer's answer through
aiohttp) instead of sendfile or splice: they must be hashed.
"""

from __future__ import annotations

import asyncio
import os
from typing import IO

from aiohttp import web

from cachenode.fill.streamed_digest import StreamedDigest
from cachenode.http.digests import Expected, Mismatch, Verifier, expectations
from cachenode.kernel.splice import BrokenStream, ClientGone
from cachenode.store.objects import Meta

# A stored chunk is read and hashed this much at a time.
READ = 1 << 20


def whole_digest(meta: Meta, start: int, length: int) -> Expected | None:
    """The digest a read of bytes [start, start + length) of the chunked
    object `meta` is checked against: the cheapest its origin published,
    when the read is of the whole object; else None."""
    manifest = meta.manifest
    if manifest is None or start != 0 or length != manifest.length or length == 0:
        return None
    return expectations(meta.headers, status=meta.status).cheapest()


class CheckedBody:
    """The client's response as the chunk sources write to it (`write`,
    `send_file`), every byte fed to the check in order, the last one held."""

    def __init__(self, resp: web.StreamResponse, expected: Expected, *, length: int) -> None:
        self.resp = resp
        self.check = StreamedDigest(Verifier(expected))
        self._left = length
        self._held = b""

    async def write(self, data: bytes) -> None:
        if len(data) > self._left:
            raise BrokenStream(f"a source sent {len(data) - self._left} bytes past the object's end")
        await self.check.feed(data)
        self._left -= len(data)
        if self._left == 0:
            self._held, data = data[-1:], data[:-1]
        if data:
            await self.resp.write(data)

    async def send_file(self, request: web.Request, resp: web.StreamResponse, f: IO[bytes], offset: int,
                        count: int) -> None:
        """`SendFile` (chunks/sources.py) for a checked read: the bytes read, hashed, written."""
        loop = asyncio.get_running_loop()
        sent = 0
        while sent < count:
            data = await loop.run_in_executor(None, os.pread, f.fileno(), min(READ, count - sent), offset + sent)
            if not data:
                raise BrokenStream(f"a chunk file ended {count - sent} bytes short")
            try:
                await self.write(data)
            except ConnectionError as e:
                raise ClientGone(f"client socket: {e}", sent=sent) from e
            sent += len(data)

    async def finish(self) -> Mismatch | None:
        """Every byte came: None once they match (the last byte then sent), else both digests."""
        mismatch = await self.check.mismatch()
        if mismatch is None and self._held:
            await self.resp.write(self._held)
        return mismatch
