"""A local origin server whose misbehaviour tests can dial in.

It serves `files` (path -> bytes) and counts every request, so a test can
prove how often the cache went to the origin. Knobs: throttle, delay before
headers (or held until the test lets them go), die after N bytes (of a whole answer, or of a 206), lie about Content-Length, omit it (chunked),
custom status and headers per path (`fields`: repeated ones, in order),
ETag/Last-Modified, 304 and 412 handling, and one `bytes=a-b` range. Writes (PUT, POST, DELETE, PATCH, any
other method) are read as a stream and hashed, never held whole: PUT stores
the body as the path's new content (its bytes kept only when small), DELETE
removes it; `uploads` says what arrived, `raw_headers` how each request's
fields were sent (repeats and order kept).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from aiohttp import web


@dataclass
class Behaviour:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # before the headers
    held: asyncio.Event | None = None  # the headers wait until the test sets it (after any `delay`)
    rate: float | None = None  # bytes per second
    die_after: int | None = None  # drop the connection after this many body bytes
    claim_length: int | None = None  # Content-Length to announce instead of the real one
    chunked: bool = False
    fields: list[tuple[str, str]] = field(default_factory=list)  # added after `headers`, repeats kept
    ranges: bool = True  # False: Range is ignored, the whole object answered 200
    range_die_after: int | None = None  # a 206 drops its connection after this many body bytes (at `rate`)
    range_cuts: int | None = None  # how many 206s `range_die_after` cuts, the first ones; None: every one


class TestOrigin:
    __test__ = False  # not a test class

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.behaviour: dict[str, Behaviour] = {}
        self.etags: dict[str, str] = {}
        self.requests: Counter[str] = Counter()
        self.request_headers: list[dict[str, str]] = []
        self.methods: list[str] = []  # of each request, in the order of `request_headers`
        self.raw_headers: list[list[tuple[str, str]]] = []
        self.uploads: dict[str, tuple[int, str]] = {}  # path -> (bytes, sha256 hex) of the last write
        self.connections: set[tuple] = set()  # the client (address, port) of every connection that asked
        self.in_flight = 0  # requests being answered now
        self.most_in_flight = 0  # the most answered at once
        self.spans: list[tuple[str, float, float]] = []  # (path, began, ended) of every request answered
        self.url = ""

    def put(self, path: str, body: bytes, *, etag: str | None = None, **behaviour) -> None:
        self.files[path] = body
        self.etags[path] = etag or '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        self.behaviour[path] = Behaviour(**behaviour)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        began = time.monotonic()
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1
            self.spans.append((request.path_qs, began, time.monotonic()))

    def hold_until_in_flight(self, count: int, *, wait: float = 10) -> asyncio.Event:
        """Hold every answer until `count` requests are being answered at once (at most `wait` seconds,
        then answer anyway: a test's count of what reached the origin at once tells). The event set
        then is returned: cleared, the next answers are held again (a second wave)."""
        answer = self._answer
        full = asyncio.Event()

        async def held(request: web.Request) -> web.StreamResponse:
            if self.in_flight >= count:
                full.set()
            try:
                await asyncio.wait_for(full.wait(), wait)
            except asyncio.TimeoutError:
                pass
            return await answer(request)

        self._answer = held  # type: ignore[method-assign]
        return full

    def most_at_once(self, wanted: Callable[[str], bool]) -> int:
        """The most requests for `wanted` paths answered at once: `most_in_flight` counts every request,
        such as a manifest read while the fills it named ran."""
        edges = sorted([(t, 1) for p, t, _ in self.spans if wanted(p)]
                       + [(t, -1) for p, _, t in self.spans if wanted(p)])  # an end before a start at a tie
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        self.requests[path] += 1
        if request.transport is not None:
            self.connections.add(request.transport.get_extra_info("peername"))
        self.request_headers.append(dict(request.headers))
        self.methods.append(request.method)
        self.raw_headers.append(list(request.headers.items()))
        if request.method not in ("GET", "HEAD"):
            return await self.write(request, path)
        if path not in self.files:
            return web.Response(status=404, text=f"no {path}\n")
        body = self.files[path]
        b = self.behaviour[path]
        if b.delay:
            await asyncio.sleep(b.delay)
        if b.held is not None:
            await b.held.wait()
        etag = self.etags[path]
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag, **b.headers})
        if request.headers.get("If-Match", etag) != etag:
            return web.Response(status=412, headers={"ETag": etag})
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers.get("Range", ""))
        if wanted and b.ranges and b.status == 200 and not b.chunked and b.claim_length is None:
            start, end = int(wanted.group(1)), min(int(wanted.group(2)), len(body) - 1)
            fields = {"ETag": etag, "Content-Range": f"bytes {start}-{end}/{len(body)}", **b.headers}
            if b.range_die_after is not None and b.range_cuts != 0:
                b.range_cuts = None if b.range_cuts is None else b.range_cuts - 1
                return await self._cut_range(request, body[start:end + 1], fields, b)
            return web.Response(status=206, body=body[start:end + 1], headers=fields)
        resp = web.StreamResponse(status=b.status)
        resp.headers["ETag"] = etag
        resp.headers["Content-Type"] = "application/octet-stream"
        resp.headers["Last-Modified"] = "Wed, 01 Jan 2025 00:00:00 GMT"
        resp.headers.update(b.headers)
        resp.headers.extend(b.fields)
        if b.chunked:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = b.claim_length if b.claim_length is not None else len(body)
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        limit = len(body) if b.die_after is None else min(b.die_after, len(body))
        step = 64 * 1024
        if b.rate:
            step = max(1024, int(b.rate / 20))
        for i in range(0, limit, step):
            await resp.write(body[i:min(i + step, limit)])
            if b.rate:
                await asyncio.sleep(step / b.rate)
        if b.die_after is not None:
            await asyncio.sleep(0.05)
            request.transport.close()
            return resp
        await resp.write_eof()
        return resp

    @staticmethod
    async def _cut_range(request: web.Request, part: bytes, fields: dict[str, str],
                         b: Behaviour) -> web.StreamResponse:
        """A 206 of `part` that drops its connection after `b.range_die_after` body bytes: an origin
        dying mid-range."""
        resp = web.StreamResponse(status=206, headers=fields)
        resp.content_length = len(part)
        await resp.prepare(request)
        limit = min(b.range_die_after or 0, len(part))
        step = max(1024, int(b.rate / 20)) if b.rate else 64 * 1024
        for i in range(0, limit, step):
            await resp.write(part[i:min(i + step, limit)])
            if b.rate:
                await asyncio.sleep(step / b.rate)
        await asyncio.sleep(0.05)
        request.transport.close()
        return resp

    async def write(self, request: web.Request, path: str) -> web.StreamResponse:
        digest, size = hashlib.sha256(), 0
        kept = bytearray()
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            size += len(chunk)
            if size <= SMALL:
                kept += chunk
        self.uploads[path] = (size, digest.hexdigest())
        if request.method == "PUT":
            self.put(path, bytes(kept) if size <= SMALL else b"", headers=self.behaviour.get(path, Behaviour()).headers)
            return web.Response(status=200, headers={"ETag": self.etags[path]})
        if request.method == "DELETE":
            self.files.pop(path, None)
            return web.Response(status=204)
        return web.json_response({"method": request.method, "received": size, "sha256": digest.hexdigest()})


SMALL = 1 << 20  # uploads up to this size become the path's new content
