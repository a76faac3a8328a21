"""A local stand-in for a slow dataset host, used by `nezha demo` and the benchmarks.

Serves the files of one folder over HTTP on 127.0.0.1, optionally throttled
per connection to imitate a rate-limited internet origin. It counts the GETs
it answered, so callers can show how often the origin was really asked.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from aiohttp import web


class LocalOrigin:
    """`ranges`: the throttled origin also answers `Range: bytes=a-b` (under
    If-Range), limited per connection like S3 or GCS, so parallel fills can
    be measured against it; the demo keeps the plain one-stream host it
    imitates. Unthrottled, aiohttp's FileResponse always answers ranges."""

    def __init__(self, root: Path, *, rate: float | None = None, chunk: int = 64 * 1024,
                 ranges: bool = False) -> None:
        self.root = Path(root).resolve()
        self.rate = rate
        self.chunk = chunk
        self.ranges = ranges
        self.gets = 0
        self.sent = 0  # body bytes written to clients (throttled mode): what a fill cost the origin
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = (self.root / request.path.lstrip("/")).resolve()
        if self.root not in path.parents or not path.is_file():
            raise web.HTTPNotFound(text=f"no {request.path}\n")
        if request.method == "GET":
            self.gets += 1
        if not self.rate:
            return web.FileResponse(path)
        st = path.stat()
        size = st.st_size
        etag = f'"{st.st_mtime_ns:x}-{size:x}"'
        resp = web.StreamResponse()
        first, last = 0, size - 1
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", "")) if self.ranges else None
        if wanted and request.headers.get("If-Range", etag) == etag and int(wanted.group(1)) < size:
            first, last = int(wanted.group(1)), min(int(wanted.group(2) or last), last)
            resp.set_status(206)
            resp.headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        if self.ranges:
            resp.headers["Accept-Ranges"] = "bytes"
        resp.content_length = last + 1 - first
        resp.content_type = "application/octet-stream"
        resp.headers["ETag"] = etag
        resp.last_modified = st.st_mtime
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        loop = asyncio.get_running_loop()
        step = max(4096, min(self.chunk, int(self.rate / 20)))
        start = loop.time()
        sent = 0
        try:
            with open(path, "rb") as f:
                while sent < last + 1 - first:
                    data = await loop.run_in_executor(None, os.pread, f.fileno(),
                                                      min(step, last + 1 - first - sent), first + sent)
                    await resp.write(data)
                    sent += len(data)
                    self.sent += len(data)
                    ahead = sent / self.rate - (loop.time() - start)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client closed early: a parallel fill closes a range once it has what it needs
        return resp
