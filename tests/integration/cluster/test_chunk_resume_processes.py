"""A chunk's fill whose source is killed mid-chunk goes on from the byte it reached (issue 38, item 4): real
node processes, a real redis-server, an origin that answers ranges under If-Range.

Three nodes, two owners per chunk. Five clients read one cold chunk at once: three through its second owner
(which copies the chunk from its first owner's fill as it grows) and two through the third node (which passes
it on from the owners). The origin sends the first owner's fill P bytes of the chunk and holds the rest; once
every client has those P bytes (so every copy has them), the first owner is SIGKILLed. The second owner, now
the chunk's first live owner, asks the origin for the rest of the chunk from byte P, once, for all five
clients: not the whole chunk again. If the object changed at the origin in between, that request's If-Range
no longer matches: the bytes kept are thrown away, no node stores the chunk, every client's body is cut after
the old version's bytes (never a mix), and the next read gets the new version whole.

Deterministic: the origin holds at a byte count, and the test waits on what the clients received, never on
time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import signal
from dataclasses import dataclass
from typing import AsyncIterator

import aiohttp
from aiohttp import web

from nezha.chunks import Layout, chunk_key, place
from nezha.config import Origin
from nezha.dev.local_cluster import LocalCluster
from testkit.ports import free_run
from tests.integration.cluster.conftest import HOST, running, settle

KiB, MiB = 1 << 10, 1 << 20
SIZE, CHUNK = 4 * MiB, 1 * MiB
HELD_AT = 300 * KiB + 17  # the bytes of the chunk the origin sends the first owner's fill before it holds


def body_of(seed: bytes) -> bytes:
    """SIZE bytes in which no 32-byte stretch repeats: a misplaced or foreign byte shows."""
    return b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(SIZE // 32))


class HoldingOrigin:
    """An origin of one object that honours Range under If-Range (RFC 9110 §13.1.5): the range while the
    ETag still matches, else the whole object, 200. Its first answer for the range starting at `hold_from`
    sends `held_at` bytes, sets `holding` and sends nothing more until `release`. `seen`: every request's
    method, Range and If-Range, in order."""

    def __init__(self, body: bytes, etag: str) -> None:
        self.body, self.etag = body, etag
        self.hold_from: int | None = None  # set once the ring says which chunk to hold
        self.held_at = 0
        self.holding, self.release = asyncio.Event(), asyncio.Event()
        self.seen: list[tuple[str, str | None, str | None]] = []
        self._held = False

    def replace(self, body: bytes, etag: str) -> None:
        """The object changes: a new version under a new ETag."""
        self.body, self.etag = body, etag

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.headers.get("Range"), request.headers.get("If-Range")))
        body, etag = self.body, self.etag
        headers = {"ETag": etag, "Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"}
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers.get("Range", ""))
        if_range = request.headers.get("If-Range")
        start, end, status = 0, len(body) - 1, 200
        if wanted is not None and (if_range is None or if_range == etag):
            start, end, status = int(wanted.group(1)), int(wanted.group(2)), 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end + 1 - start
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        if status == 206 and start == self.hold_from and not self._held:
            self._held = True
            await resp.write(body[start:start + self.held_at])
            self.holding.set()
            await self.release.wait()
            start += self.held_at
        try:
            for at in range(start, end + 1, 256 * KiB):
                await resp.write(body[at:min(at + 256 * KiB, end + 1)])
            await resp.write_eof()
        except (ConnectionError, RuntimeError):  # the node it answered was killed
            pass
        return resp

    def ranges_of(self, first: int, last: int) -> list[tuple[str | None, str | None]]:
        """(Range, If-Range) of every GET for bytes within [first, last]."""
        out = []
        for method, asked, if_range in self.seen:
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", asked or "")
            if method == "GET" and m is not None and first <= int(m.group(1)) <= last:
                out.append((asked, if_range))
        return out


def a_chunk_killed_under_its_readers(ring) -> tuple[str, int, str, str, str]:
    """A path and a chunk of it past the first whose first owner (the one to kill) owns nothing of the key
    itself (its manifest stays on the two others): (path, index, first owner, second owner, third node)."""
    for i in range(500):
        path = f"/resume/{i}.bin"
        key = f"http://{HOST}{path}"
        table = place(ring, key, Layout(size=SIZE, chunk_size=CHUNK), 2)
        for index in range(1, len(table)):
            first, second = table[index]
            third = next(n for n in ("node-0", "node-1", "node-2") if n not in (first, second))
            if first not in ring.owners(key, 2):
                return path, index, first, second, third
    raise AssertionError("no path fits")


class Reader:
    """One client's GET of a byte range: what it received (hashed, counted) and how it ended."""

    def __init__(self, url: str, path: str, first: int, last: int) -> None:
        self.url, self.path, self.first, self.last = url, path, first, last
        self.got, self.digest, self.status, self.cut, self.ended = 0, hashlib.sha256(), None, False, False
        self.moved = asyncio.Event()

    async def run(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.url + self.path,
                                   headers={"Host": HOST, "Range": f"bytes={self.first}-{self.last}"}) as r:
                self.status = r.status
                try:
                    async for data in r.content.iter_chunked(64 * KiB):
                        self.digest.update(data)
                        self.got += len(data)
                        self.moved.set()
                except aiohttp.ClientPayloadError:
                    self.cut = True
        finally:
            self.ended = True
            self.moved.set()

    def outcome(self) -> tuple[int | None, int, bool, str]:
        return self.status, self.got, self.cut, self.digest.hexdigest()


@dataclass
class Held:
    """The scene once every client has the HELD_AT bytes the origin sent of the chunk, and the origin holds."""

    origin: HoldingOrigin
    cluster: LocalCluster
    session: aiohttp.ClientSession
    path: str
    index: int
    first_owner: str
    second: str
    readers: list[Reader]
    reading: asyncio.Future

    @property
    def span(self) -> tuple[int, int]:
        return self.index * CHUNK, (self.index + 1) * CHUNK - 1

    async def kill_first_owner(self) -> None:
        """SIGKILL the chunk's first owner, let the origin answer on, and wait for every client's end."""
        victim = self.cluster.nodes[self.first_owner].proc
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(5) == -signal.SIGKILL
        self.origin.release.set()
        await self.reading

    def holders(self) -> list[str]:
        """The nodes whose disk holds the chunk committed (its meta file)."""
        ckey = chunk_key(f"http://{HOST}{self.path}", self.index, CHUNK)
        return sorted(nid for nid, node in self.cluster.nodes.items()
                      for p in (node.data_dir / "objects").rglob("*.meta") if json.loads(p.read_text())["key"] == ckey)


@contextlib.asynccontextmanager
async def held(aiohttp_server, redis_server, tmp_path, body: bytes) -> AsyncIterator[Held]:
    """Three nodes of an origin of `body` ('"v1"'); the object's manifest and chunk 0 read; then five clients
    reading one chunk, three through its second owner and two through the third node, until each has the
    HELD_AT bytes the origin sent its first owner's fill."""
    origin = HoldingOrigin(body, '"v1"')
    server = await aiohttp_server(origin.app(), host="127.0.0.1")
    cluster = LocalCluster(nodes=3, origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{server.port}")],
                           data_dir=tmp_path / "c", base_port=free_run(3), replicas=2, redis_url=redis_server.url,
                           log_level="info", node_settings={"chunk_threshold": "2MiB", "chunk_size": "1MiB"})
    async with running(cluster), aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        ring = (await cluster.index.get_membership()).ring()
        path, index, first_owner, second, third = a_chunk_killed_under_its_readers(ring)
        origin.hold_from, origin.held_at = index * CHUNK, HELD_AT
        async with session.get(cluster.nodes[second].url + path,
                               headers={"Host": HOST, "Range": f"bytes=0-{CHUNK - 1}"}) as r:
            assert (r.status, await r.read()) == (206, body[:CHUNK])  # the manifest, and chunk 0
        await settle(cluster)
        readers = [Reader(cluster.nodes[n].url, path, index * CHUNK, (index + 1) * CHUNK - 1)
                   for n in (second, second, second, third, third)]
        reading = asyncio.gather(*(r.run(session) for r in readers))
        try:
            await origin.holding.wait()
            for reader in readers:
                while reader.got < HELD_AT and not reader.ended:
                    reader.moved.clear()
                    await reader.moved.wait()
            assert [r.got for r in readers] == [HELD_AT] * 5, "a client had bytes no node had"
            yield Held(origin, cluster, session, path, index, first_owner, second, readers, reading)
        finally:
            origin.release.set()
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)


async def test_a_chunk_whose_source_is_killed_mid_chunk_costs_the_origin_one_request_for_the_missing_range(
        aiohttp_server, redis_server, tmp_path):
    """Every client gets the chunk's exact bytes; the origin is asked for the chunk once and for its rest
    from byte HELD_AT once, under the same If-Range, however many clients wait on it; the second owner
    stores the chunk."""
    v1 = body_of(b"v1")
    async with held(aiohttp_server, redis_server, tmp_path, v1) as scene:
        await scene.kill_first_owner()
        a, b = scene.span
        want = hashlib.sha256(v1[a:b + 1]).hexdigest()
        assert [r.outcome() for r in scene.readers] == [(206, CHUNK, False, want)] * 5
        assert scene.origin.ranges_of(a, b) == [(f"bytes={a}-{b}", '"v1"'), (f"bytes={a + HELD_AT}-{b}", '"v1"')], \
            f"the origin was asked for {scene.origin.seen}"
        await settle(scene.cluster)
        assert scene.holders() == [scene.second]


async def test_a_chunk_whose_object_changed_before_its_rest_was_asked_is_thrown_away_and_read_anew(
        aiohttp_server, redis_server, tmp_path):
    """The object changes at the origin while the first owner's fill is held: the rest, asked under If-Range
    on the old ETag, comes back as the new version's 200, so the bytes kept are thrown away and no node
    stores the chunk; every client's body is cut after exactly the old version's HELD_AT bytes (never a
    byte of the new one), and the next read gets the new version's bytes whole."""
    v1, v2 = body_of(b"v1"), body_of(b"v2")
    async with held(aiohttp_server, redis_server, tmp_path, v1) as scene:
        scene.origin.replace(v2, '"v2"')
        await scene.kill_first_owner()
        a, b = scene.span
        old = hashlib.sha256(v1[a:a + HELD_AT]).hexdigest()
        assert [r.outcome() for r in scene.readers] == [(206, HELD_AT, True, old)] * 5
        asked = scene.origin.ranges_of(a, b)
        assert asked[:2] == [(f"bytes={a}-{b}", '"v1"'), (f"bytes={a + HELD_AT}-{b}", '"v1"')], scene.origin.seen
        await settle(scene.cluster)
        assert scene.holders() == []
        async with scene.session.get(scene.cluster.nodes[scene.second].url + scene.path,
                                     headers={"Host": HOST, "Range": f"bytes={a}-{b}"}) as r:
            assert (r.status, r.headers.get("ETag"), await r.read()) == (206, '"v2"', v2[a:b + 1])
