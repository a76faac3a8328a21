from __future__ import annotations

from pathlib import Path

import aiohttp
from multidict import CIMultiDict  # noqa: F401  (type of returned headers)
import pytest

from cachenode.app import Listener, build_node
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
                                   auto_decompress=False) as r:
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


@pytest.fixture
async def session():
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        yield s
