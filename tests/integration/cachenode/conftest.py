from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from multidict import CIMultiDict  # noqa: F401  (type of returned headers)
import pytest

from cachenode.app import Listener, build_node
from cachenode.keys import cache_key, parse_target
from nezha.config import CacheSettings, Origin

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
@dataclass(frozen=True)
class Members:
    epoch: int
    nodes: dict[str, str]
    weights: dict[str, int] = field(default_factory=dict)


def key_of(path: str) -> str:
    return cache_key(parse_target(path, HOST))


@pytest.fixture
def cluster(make_node, tmp_path):
    async def build(n: int, *, replicas: int = 1, **settings):
        nodes = {}
        for i in range(n):
            node = await make_node(data_dir=tmp_path / f"n{i}", node_id=f"n{i}", replicas=replicas, **settings)
            nodes[f"n{i}"] = node
        members = Members(1, {nid: f"127.0.0.1:{nd.server.port}" for nid, nd in nodes.items()})
        for nd in nodes.values():
            nd.node.cluster.update(members)
        return nodes, members

    return build


def owner_and_other(nodes, path, replicas=1):
    anyone = next(iter(nodes.values()))
    owners = [p.id for p in anyone.node.cluster.owners(key_of(path), replicas)]
    others = [nid for nid in nodes if nid not in owners]
    return owners, others
