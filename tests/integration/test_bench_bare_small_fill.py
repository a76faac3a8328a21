"""bench/bare_small_fill.py's bare server answers exact bytes: its fills/s are a ceiling only if it does.

The server is run as the benchmark runs it (a child process, `--serve`),
in front of a small aiohttp origin on 127.0.0.1 that counts what it is
asked; each request is made on one kept-alive raw connection, as wrk does.
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
from pathlib import Path

import google_crc32c
import pytest
from aiohttp import web

from testkit.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
LOOPS = ["asyncio"] + (["uvloop"] if subprocess.run([sys.executable, "-c", "import uvloop"]).returncode == 0 else [])


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> tuple[int, dict, bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: images.test\r\n\r\n".encode())
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    lines = head.split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return int(lines[0].split()[1]), fields, await reader.readexactly(int(fields["content-length"]))


async def serving(port: int, upstream: int, folder: Path, *flags: str) -> asyncio.subprocess.Process:
    """The bench's server (`--serve` and `flags`) on `port` in front of the origin on `upstream`, once it
    says it listens."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "bare_small_fill.py"), "--serve", *flags,
        "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{upstream}", "--dir", str(folder),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"listening"
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc


def unpacked(data: bytes) -> tuple[str, bytes]:
    """A stored file's key and body, its header's length and checksum checked."""
    magic, size, crc, key_size = struct.unpack_from("<4sQIH", data)
    key, body = data[18:18 + key_size].decode(), data[18 + key_size:]
    assert (magic, size, crc) == (b"BSF1", len(body), google_crc32c.value(body)), key
    return key, body


@pytest.mark.parametrize("loop", LOOPS)
async def test_a_miss_then_a_hit_answer_the_origins_exact_bytes_and_the_origin_is_asked_once(aiohttp_server,
                                                                                             tmp_path, loop):
    bodies = {f"/d/{n}.bin": os.urandom(size) for n, size in enumerate((0, 1, 16 * 1024, 300 * 1024))}
    asked: list[str] = []

    async def origin(request: web.Request) -> web.StreamResponse:
        asked.append(request.path)
        if request.path not in bodies:
            return web.Response(status=404, body=b"no such file")
        body = bodies[request.path]
        answer = web.StreamResponse(headers={"Content-Length": str(len(body))})
        await answer.prepare(request)
        for at in range(0, len(body), 7000):  # in pieces: the server must put the body together
            await answer.write(body[at:at + 7000])
            await asyncio.sleep(0)
        return answer

    app = web.Application()
    app.router.add_get("/{tail:.*}", origin)
    server = await aiohttp_server(app, host="127.0.0.1")
    port = free_port()
    proc = await serving(port, server.port, tmp_path, "--loop", loop)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path, body in bodies.items():
            for cache in ("MISS", "HIT"):
                status, fields, got = await ask(reader, writer, path)
                assert (status, fields.get("x-cache"), got) == (200, cache, body), (path, cache)
        assert asked == list(bodies)
        for _ in range(2):  # not stored: asked of the origin again, its answer passed on
            assert await ask(reader, writer, "/nothing") == (404, {"content-length": "12"}, b"no such file")
        assert asked == [*bodies, "/nothing", "/nothing"]
        # Many at once on connections of their own: the pool grows and every answer is its own path's.
        more = {f"/m/{n}.bin": os.urandom(20000 + n) for n in range(40)}
        bodies.update(more)
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in more]
        answers = await asyncio.gather(*(ask(r, w, p) for (r, w), p in zip(conns, more)))
        assert [a[2] for a in answers] == list(more.values())
        stored = dict(unpacked(f.read_bytes()) for f in tmp_path.glob("objects/*/*.obj"))
        assert stored == bodies
        writer.close()
        for _, w in conns:
            w.close()
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert err.decode().strip() == f"bare: {len(bodies)} objects stored"


async def test_with_the_nodes_rules_a_small_miss_is_stored_in_the_nodes_store_and_read_back_exact(aiohttp_server,
                                                                                                  tmp_path):
    """`--rules`: a small 200 judged, stored by the node's store and answered with the node's miss head; a hit
    read back from that store; an answer too large to store whole at once (past the store's small_max)
    passed on unstored, so asked again; a 404 passed on."""
    from cachenode.store.disk import Store

    bodies = {f"/d/{n}.bin": os.urandom(size) for n, size in enumerate((1, 16 * 1024, 100 * 1024))}
    large = {"/big.bin": os.urandom(300 * 1024)}
    asked: list[str] = []

    async def origin(request: web.Request) -> web.Response:
        asked.append(request.path)
        body = {**bodies, **large}.get(request.path)
        if body is None:
            return web.Response(status=404, body=b"no such file")
        return web.Response(body=body, headers={"ETag": '"v1"'})

    app = web.Application()
    app.router.add_get("/{tail:.*}", origin)
    server = await aiohttp_server(app, host="127.0.0.1")
    port = free_port()
    proc = await serving(port, server.port, tmp_path, "--rules", "--host", "images.test")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path, body in bodies.items():
            for cache in ("miss", "hit"):  # the node's labels, on the node's heads
                status, fields, got = await ask(reader, writer, path)
                assert (status, fields.get("x-nezha-cache"), got) == (200, cache, body), (path, cache)
                assert fields["etag"] == '"v1"' and fields["via"].startswith("1.1 ")
        for _ in range(2):
            status, fields, got = await ask(reader, writer, "/big.bin")
            assert (status, fields.get("x-cache"), got) == (200, "PASS", large["/big.bin"])
            assert await ask(reader, writer, "/nothing") == (404, {"content-length": "12"}, b"no such file")
        assert asked == [*bodies, "/big.bin", "/nothing", "/big.bin", "/nothing"]
        writer.close()
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert err.decode().strip().endswith(f"bare: {len(bodies)} objects stored")
    store = Store(tmp_path / "node")
    await store.open()
    try:
        for path, body in bodies.items():
            meta = store.lookup(f"http://images.test{path}")
            assert meta is not None and meta.size == len(body) and meta.url.endswith(path), path
    finally:
        await store.close()


async def test_with_the_nodes_rules_a_miss_answered_other_than_200_leaves_nothing_of_its_path_behind(tmp_path):
    """What `Ruled.find` notes of a miss (its target, origin, key, fields) goes when its answer comes, whatever
    the status: paths asked that the origin does not hold would otherwise grow the server's memory for good."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bare_small_fill import Ruled
    finally:
        sys.path.remove(str(ROOT / "bench"))
    ruled = Ruled(("127.0.0.1", 9), tmp_path, "images.test")
    await ruled.store.open(background=False)
    try:
        class Conn:  # an origin connection, as far as an answer's handling reads it
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 4"

        conn = Conn()
        for status in (200, 404, 502):
            key = b"/d/%d.bin" % status
            assert ruled.find(key, b"GET %s HTTP/1.1\r\nHost: images.test" % key) is None
            assert key in ruled.named
            ruled.filling[key] = []
            ruled.answered(conn, key, status, b"body", False)
            assert ruled.named == {}, status
    finally:
        await ruled.store.close()
