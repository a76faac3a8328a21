from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from multidict import CIMultiDict  # noqa: F401  (type of returned headers)
import pytest

from cachenode.app import build_node
from cachenode.front.listener import Listener
from nezha.keys import cache_key, parse_target
from nezha.ring import Membership
from nezha.config import CacheSettings, Origin
from testkit.ports import free_port
from testkit.waits import START_GUARD, until_http
from testkit.logs import log_events

HOST = "www.cs.toronto.edu"


class Node:
    """A node listening on 127.0.0.1 exactly as `nezha cache` does (fast path in front)."""

    def __init__(self, server: Listener, node) -> None:
        self.server = server
        self.node = node
        self.url = f"http://127.0.0.1:{server.port}"

    async def get(self, session: aiohttp.ClientSession, path: str, *, host: str = HOST, method: str = "GET",
                  headers: dict | None = None) -> tuple[int, "CIMultiDict[str]", bytes]:
        async with session.request(method, self.url + path, headers={"Host": host, **(headers or {})},
                                   auto_decompress=False, allow_redirects=False) as r:
            return r.status, r.headers.copy(), await r.read()


@pytest.fixture
async def make_node(origin, tmp_path: Path):
    listeners: list[Listener] = []

    async def make(*, data_dir: Path | None = None, **settings) -> Node:
        s = CacheSettings(
            listen="127.0.0.1:0",
            data_dir=data_dir or tmp_path / "node",
            origins=settings.pop("origins", [Origin(host=HOST, upstream=origin.url)]),
            **settings,
        )
        node = build_node(s)
        listener = Listener(node)
        await listener.start("127.0.0.1", 0)
        listeners.append(listener)
        return Node(listener, node)

    yield make
    for listener in listeners:
        await listener.close()


async def until(predicate, timeout: float = 5.0) -> None:
    """Poll `predicate()` until true; no fixed sleep that a loaded machine could outlast."""
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not true within {timeout} s")


def logged(logs: list[dict], *events: str):
    """A predicate for `until`: one of `events` is in the captured logs."""
    return lambda: any(e["event"] in events for e in logs)


async def hang_up_after(node: Node, path: str, nbytes: int) -> None:
    """A client of its own reads `nbytes` of `path`'s body, then hangs up mid-body."""
    async with aiohttp.ClientSession() as quitter:
        async with quitter.get(node.url + path, headers={"Host": HOST}) as r:
            await r.content.readexactly(nbytes)
            r.close()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        yield s


@pytest.fixture
async def silent_server():
    """Start servers that take connections and never answer a byte: a frozen
    process, or a connection an aiohttp server accepted while shutting down.
    Each call returns one server's host:port."""
    import asyncio

    servers: list[asyncio.AbstractServer] = []
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(65536):  # swallow the request; answer nothing
            pass

    async def start() -> str:
        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        servers.append(server)
        return f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for w in writers:
        w.close()
    for s in servers:
        s.close()
        await s.wait_closed()


class RangedOrigin:
    """An origin that honours Range under If-Range (RFC 9110 §13.1.5, §14.2):
    the range while the validator still matches, else the whole object.
    `rate` (bytes/s) makes it slow; `seen` holds every request's headers."""

    def __init__(self, body: bytes, headers: dict[str, str], *, rate: float | None = None) -> None:
        self.body = body
        self.headers = headers
        self.rate = rate
        self.seen: list[dict[str, str]] = []

    def app(self) -> "web.Application":
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        return app

    async def handle(self, request: "web.Request") -> "web.StreamResponse":
        import asyncio
        import re

        from aiohttp import web

        self.seen.append(dict(request.headers))
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", ""))
        if_range = request.headers.get("If-Range")
        start, end = 0, len(self.body) - 1
        resp = web.StreamResponse(headers=self.headers)
        if wanted and (if_range is None or if_range in self.headers.values()):
            start, end = int(wanted.group(1)), int(wanted.group(2) or end)
            resp.set_status(206)
            resp.headers["Content-Range"] = f"bytes {start}-{end}/{len(self.body)}"
        resp.content_length = end + 1 - start
        await resp.prepare(request)
        step = max(1024, int(self.rate / 20)) if self.rate else 256 * 1024
        for i in range(start, end + 1, step):
            await resp.write(self.body[i:min(i + step, end + 1)])
            if self.rate:
                await asyncio.sleep(step / self.rate)
        await resp.write_eof()
        return resp


# -- clusters of in-process nodes (relay, replicas, invalidation) ----------------
def flip_byte(path, at: int, mask: int = 0x01) -> None:
    """Change one byte of a stored file in place, as a failing disk would (issue 37's fault injection)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ mask]))


def key_of(path: str) -> str:
    return cache_key(parse_target(path, HOST))


@pytest.fixture
def cluster(make_node, tmp_path):
    async def build(n: int, *, replicas: int = 1, **settings):
        nodes = {}
        for i in range(n):
            node = await make_node(data_dir=tmp_path / f"n{i}", node_id=f"n{i}", replicas=replicas, **settings)
            nodes[f"n{i}"] = node
        members = Membership(1, {nid: f"127.0.0.1:{nd.server.port}" for nid, nd in nodes.items()})
        for nd in nodes.values():
            nd.node.cluster.update(members)
        return nodes, members

    return build


def owner_and_other(nodes, path, replicas=1):
    anyone = next(iter(nodes.values()))
    owners = [p.id for p in anyone.node.cluster.owners(key_of(path), replicas)]
    others = [nid for nid in nodes if nid not in owners]
    return owners, others


class RawOrigin:
    """An origin written on bare sockets, since aiohttp's server always frames
    its bodies. It answers every request with `body` and then closes; with
    `framing="close"` the close is the only end of the body (no
    Content-Length, no chunked), with "length" it sends a Content-Length.
    With `hold_after`, it stops after that many bytes until `release` is set.
    `extra_head` lines are sent as given, byte for byte."""

    def __init__(self, body: bytes, *, framing: str = "close", version: str = "1.1",
                 hold_after: int | None = None, extra_head: tuple[bytes, ...] = (),
                 content_type: bytes = b"application/octet-stream") -> None:
        self.body = body
        self.framing = framing
        self.version = version
        self.hold_after = hold_after
        self.extra_head = extra_head
        self.content_type = content_type
        self.release = asyncio.Event()
        self.requests = 0
        self.url = ""
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> "RawOrigin":
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            head = [f"HTTP/{self.version} 200 OK", "Cache-Control: max-age=3600", 'ETag: "raw"', "Connection: close"]
            if self.framing == "length":
                head.append(f"Content-Length: {len(self.body)}")
            writer.write(b"".join(line.encode() + b"\r\n" for line in head)
                         + b"".join(line + b"\r\n" for line in (b"Content-Type: " + self.content_type,
                                                                    *self.extra_head)) + b"\r\n")
            split = len(self.body) if self.hold_after is None else self.hold_after
            writer.write(self.body[:split])
            await writer.drain()
            if self.hold_after is not None:
                await self.release.wait()
            writer.write(self.body[split:])
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw_origin():
    origins: list[RawOrigin] = []

    async def start(body: bytes, **kwargs) -> RawOrigin:
        o = await RawOrigin(body, **kwargs).start()
        origins.append(o)
        return o

    yield start
    for o in origins:
        o.release.set()
        await o.close()


async def read_response(reader: asyncio.StreamReader, *, method: str = "GET") -> tuple[bytes, bytes]:
    """One response off a raw connection: its head as sent (bytes, blank line
    included) and its Content-Length body. Raises IncompleteReadError if the
    connection ends first."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    status = int(head.split(b" ", 2)[1])
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        length = 0
    return head, await reader.readexactly(length)


async def exchange(port: int, data: bytes, *, responses: int = 1, half_close: bool = False,
                   timeout: float = 5.0, methods: tuple[str, ...] = ()) -> list[tuple[bytes, bytes]]:
    """Send `data` as written on a new connection to 127.0.0.1:`port` (then
    `shutdown(SHUT_WR)` if `half_close`) and read `responses` answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        if half_close:
            writer.write_eof()
        got = []
        for i in range(responses):
            method = methods[i] if i < len(methods) else "GET"
            got.append(await asyncio.wait_for(read_response(reader, method=method), timeout))
        return got
    finally:
        writer.close()


def header_line(head: bytes, name: bytes) -> bytes | None:
    """The raw value of field `name` in a response head, None if absent."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.lower() == name.lower():
            return value.strip()
    return None


class NodeProcess:
    """`nezha cache` as a process on 127.0.0.1 with its own open-files limit; stdout in a file."""

    def __init__(self, tmp_path: Path, origin_url: str | None, *, nofile: tuple[int, int] = (4096, 4096),
                 args: tuple[str, ...] = (), port: int | None = None):
        self.port = port or free_port()
        self.out = tmp_path / f"node-{self.port}-{time.monotonic_ns()}.out"
        self.err = self.out.with_suffix(".err")
        self.data_dir = tmp_path / "data"

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{self.port}",
                 "--data-dir", str(self.data_dir),
                 *(["--origin", f"{HOST}={origin_url}"] if origin_url else []), *args],
                stdout=out, stderr=err, preexec_fn=limit)

    async def ready(self, session: aiohttp.ClientSession) -> None:
        """Once the node answers /healthz; at once when it exits. Its start is no claim of these tests:
        the deadline only stops a hang (testkit/waits.py), as a node of two workers on a loaded machine
        takes many seconds to start."""
        await until_http(f"http://127.0.0.1:{self.port}/healthz", timeout=START_GUARD, proc=self.proc, log=self.err,
                         what="nezha cache", session=session)

    def wait_ready(self) -> "NodeProcess":
        """`ready` for tests that are not coroutines."""
        async def ready() -> None:
            async with aiohttp.ClientSession() as session:
                await self.ready(session)

        asyncio.run(ready())
        return self

    def written(self) -> dict[Path, str]:
        """Everything the node wrote but object bodies: its stdout and stderr,
        and every other file in its data directory (metadata, temp names),
        as text: where a credential must never be found."""
        files = [p for p in self.data_dir.rglob("*") if p.is_file() and not p.name.endswith(".data")]
        return {p: p.read_bytes().decode("utf-8", "replace") for p in [self.out, self.err, *files]}

    def events(self) -> list[dict]:
        return log_events(self.out)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def node_for_localhost(root: Path, upstream_port: int, entry: str = "", *, config_name: str = "nezha.yaml") -> NodeProcess:
    """A node process, ready, whose one origin is `localhost` reached at 127.0.0.1:`upstream_port`, plus the
    origin `entry` lines given: the node S3 clients read through when they sign for `localhost` (a bare
    machine resolves no names, the node maps this one)."""
    config = root / config_name
    config.write_text(f"origins:\n  - host: localhost\n    upstream: http://127.0.0.1:{upstream_port}\n{entry}")
    node = NodeProcess(root, None, args=("--config", str(config)))
    try:
        return node.wait_ready()
    except BaseException:
        node.stop()
        raise


@pytest.fixture
def node_process(tmp_path):
    started: list[NodeProcess] = []

    def start(origin_url: str, **kwargs) -> NodeProcess:
        node = NodeProcess(tmp_path, origin_url, **kwargs)
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()
