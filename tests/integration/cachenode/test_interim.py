"""An origin's interim answers (RFC 9110 §15.2): a 103 Early Hints reaches the
client it was sent for, before the final answer, and is never stored."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST

HINT = b"HTTP/1.1 103 Early Hints\r\nLink: </styles.css>; rel=preload; as=style\r\nX-Hint: 1\r\n\r\n"


@pytest.fixture
async def hinting(aiohttp_server):
    """An origin whose every answer is preceded by a 103; `cache_control` per path."""
    asked: list[str] = []

    async def get(request: web.Request) -> web.Response:
        asked.append(request.path)
        await request.writer.write(HINT)
        request.writer.output_size = 0
        cc = {"/stored": "max-age=3600", "/passed": "no-store"}[request.path]
        return web.Response(body=b"x" * 100, headers={"Cache-Control": cc, "Content-Type": "text/plain"})

    app = web.Application()
    app.router.add_get("/stored", get)
    app.router.add_get("/passed", get)
    server = await aiohttp_server(app, host="127.0.0.1")
    return str(server.make_url("")).rstrip("/"), asked


async def raw_get(port: int, path: str, *, version: str = "1.1") -> bytes:
    """Everything the node sends back for one request, interim answers included."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/{version}\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    return data


def heads(data: bytes) -> list[bytes]:
    """The status lines of the messages in `data`, in order."""
    return [line for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.")]


@pytest.mark.parametrize("path,second", [("/stored", b"hit"), ("/passed", b"pass")])
async def test_early_hints_reach_their_client_first_and_are_never_reused(hinting, make_node, path, second):
    url, asked = hinting
    node = await make_node(origins=[Origin(host=HOST, upstream=url)])
    first = await raw_get(node.server.port, path)
    assert heads(first)[0] == b"HTTP/1.1 103 Early Hints" and heads(first)[1].startswith(b"HTTP/1.1 200")
    assert first.startswith(HINT), "the hint goes as the origin sent it"
    final = first.split(b"\r\n\r\n", 1)[1]
    assert b"X-Hint" not in final.split(b"\r\n\r\n", 1)[0], "an interim answer's fields are not the response's"
    await node.node.settled()
    again = await raw_get(node.server.port, path)
    assert b"X-Nezha-Cache: " + second in again
    if second == b"hit":
        assert heads(again) == [b"HTTP/1.1 200 OK"] and asked == [path]
    else:
        assert heads(again)[0] == b"HTTP/1.1 103 Early Hints" and asked == [path, path]


async def test_an_http_1_0_client_gets_no_interim_answer(hinting, make_node):
    url, _ = hinting
    node = await make_node(origins=[Origin(host=HOST, upstream=url)])
    data = await raw_get(node.server.port, "/passed", version="1.0")
    assert b" 103 " not in data and len(heads(data)) == 1 and heads(data)[0].endswith(b" 200 OK")


async def test_early_hints_cross_the_relay_to_an_owner(hinting, cluster):
    """A node that is not the key's owner relays; the owner's fill hears the
    origin's 103 and the relaying node passes it on to its client."""
    from tests.integration.cachenode.conftest import owner_and_other

    url, asked = hinting
    nodes, _ = await cluster(2, origins=[Origin(host=HOST, upstream=url)])
    owners, others = owner_and_other(nodes, "/stored")
    data = await raw_get(nodes[others[0]].server.port, "/stored")
    assert heads(data)[0] == b"HTTP/1.1 103 Early Hints" and heads(data)[1].startswith(b"HTTP/1.1 200")
    assert data.count(b"103 Early Hints") == 1 and asked == ["/stored"]


async def test_early_hints_come_down_from_a_parent_tier(hinting, make_node, tmp_path):
    """A child's miss is asked of its parent, whose fill hears the origin's 103;
    the child passes the parent's copy on to its own client."""
    url, asked = hinting
    origins = [Origin(host=HOST, upstream=url)]
    parent = await make_node(data_dir=tmp_path / "parent", node_id="parent", origins=origins)
    child = await make_node(data_dir=tmp_path / "child", node_id="child", parent=parent.url, origins=origins)
    data = await raw_get(child.server.port, "/stored")
    assert heads(data)[0] == b"HTTP/1.1 103 Early Hints" and heads(data)[1].startswith(b"HTTP/1.1 200")
    assert data.count(b"103 Early Hints") == 1 and asked == ["/stored"]
