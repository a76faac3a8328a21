"""A bearer-token origin like GCS's JSON API or the Hugging Face Hub: 401
without a valid token, 403 for a valid one without access to the object,
and RFC 9110's conditional and Range semantics for a reader. Used by the
tests of `credentials: authorize` (docs/private-objects.md)."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter

from aiohttp import web

PATH = "/private/shard-0.tar"
GOOD = "tok-reader-7f3a9c"  # may read
OTHER = "tok-stranger-1b2c"  # a valid token without access
BODY = bytes(range(256)) * 400  # 100 KiB


class BearerOrigin:
    def __init__(self) -> None:
        self.body = BODY
        self.sent = 0  # bytes of the object sent (bodies of 200 and 206 answers)
        self.statuses: Counter[int] = Counter()
        self.authorizations: list[str | None] = []
        self.paced = False  # a whole body: its first 10 KiB, then the rest once `resume` is set
        self.streaming = asyncio.Event()  # a paced body has begun
        self.resume = asyncio.Event()

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'

    async def get(self, request: web.Request) -> web.StreamResponse:
        self.authorizations.append(request.headers.get("Authorization"))
        response = self._answer(request)
        self.statuses[response.status] += 1
        body = response.body or b""
        if not self.paced or response.status != 200:
            self.sent += len(body) if response.status in (200, 206) else 0
            return response
        paced = web.StreamResponse(headers=response.headers)
        paced.content_length = len(body)
        await paced.prepare(request)
        await paced.write(body[:10240])
        self.streaming.set()
        await asyncio.wait_for(self.resume.wait(), 30)
        await paced.write(body[10240:])
        self.sent += len(body)
        return paced

    def _answer(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if auth == f"Bearer {OTHER}":
            return web.Response(status=403, text="this token may not read this object\n")
        if auth != f"Bearer {GOOD}":
            return web.Response(status=401, text="a valid token is required\n",
                                headers={"WWW-Authenticate": 'Bearer realm="datasets"'})
        fields = {"ETag": self.etag, "Cache-Control": "private, max-age=3600"}
        if request.headers.get("If-None-Match") == self.etag:
            return web.Response(status=304, headers=fields)
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers.get("Range", ""))
        if wanted:
            start, end = int(wanted.group(1)), min(int(wanted.group(2)), len(self.body) - 1)
            return web.Response(status=206, body=self.body[start:end + 1], headers={
                **fields, "Content-Range": f"bytes {start}-{end}/{len(self.body)}"})
        return web.Response(body=self.body, headers={**fields, "Content-Type": "application/x-tar"})


async def serve_bearer(aiohttp_server) -> BearerOrigin:
    """A BearerOrigin on 127.0.0.1, its test server in `.server`."""
    o = BearerOrigin()
    app = web.Application()
    app.router.add_get(PATH, o.get)
    o.server = await aiohttp_server(app, host="127.0.0.1")
    return o
