from __future__ import annotations

from pathlib import Path

import aiohttp
from multidict import CIMultiDict  # noqa: F401  (type of returned headers)
import pytest

from cachenode.app import build_app, build_node
from nezha.config import CacheSettings, Origin

HOST = "www.cs.toronto.edu"


class Node:
    def __init__(self, server, node) -> None:
        self.server = server
        self.node = node
        self.url = str(server.make_url("")).rstrip("/")

    async def get(self, session: aiohttp.ClientSession, path: str, *, host: str = HOST, method: str = "GET",
                  headers: dict | None = None) -> tuple[int, "CIMultiDict[str]", bytes]:
        async with session.request(method, self.url + path, headers={"Host": host, **(headers or {})},
                                   auto_decompress=False) as r:
            return r.status, r.headers.copy(), await r.read()


@pytest.fixture
def make_node(aiohttp_server, origin, tmp_path: Path):
    async def make(*, data_dir: Path | None = None, **settings) -> Node:
        s = CacheSettings(
            listen="127.0.0.1:0",
            data_dir=data_dir or tmp_path / "node",
            origins=settings.pop("origins", [Origin(host=HOST, upstream=origin.url)]),
            **settings,
        )
        node = build_node(s)
        server = await aiohttp_server(build_app(node), host="127.0.0.1")
        return Node(server, node)

    return make


@pytest.fixture
async def session():
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        yield s
