"""A connection the fast path handed to aiohttp comes back at a clean request
boundary (cachenode/front/client_conn.py `ClientConnection.back`,
front/fastpath.py `FastPath.take_back`): one plain request handed, answered
whole with keep-alive, nothing received behind it. Anything else stays with
aiohttp for good: pipelined bytes, a request with a body, an answer cut short.

The origin here sends each answer's head before its body (as one 20 ms away
now and then does, docs/benchmarks.md): the fill streams, which the fast path
hands to the handler with its connection."""

from __future__ import annotations

import asyncio
import os

import pytest
from structlog.testing import capture_logs

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST, until
from tests.integration.cachenode.test_fast_misses import _response, completed, field, request


class HeadFirstOrigin:
    """An origin whose answers are a head, then (after `gap` seconds, or once
    `release` is set for a path in `held`) the body; a path in `cut` gets
    half its body and then the connection's end."""

    def __init__(self, bodies: dict[str, bytes], *, gap: float = 0.05) -> None:
        self.bodies = bodies
        self.gap = gap
        self.held: set[str] = set()
        self.cut: set[str] = set()
        self.release = asyncio.Event()
        self.asked: list[str] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                path = (await reader.readuntil(b"\r\n\r\n")).split(b" ")[1].decode()
                self.asked.append(path)
                body = self.bodies[path]
                writer.write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=3600\r\nContent-Length: %d\r\n\r\n"
                             % len(body))
                await writer.drain()
                if path in self.held:
                    await self.release.wait()
                else:
                    await asyncio.sleep(self.gap)  # the head is read alone: the body comes in a later read
                if path in self.cut:
                    writer.write(body[:len(body) // 2])
                    await writer.drain()
                    break
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _bodies(n: int) -> dict[str, bytes]:
    return {f"/apart/{i}.bin": os.urandom(16 * 1024 + i) for i in range(n)}


@pytest.fixture
async def head_first(make_node):
    """What every test here starts from: a HeadFirstOrigin with the bodies
    given, a node in front of it and one raw connection to the node."""
    made: list[HeadFirstOrigin | asyncio.StreamWriter] = []

    async def start(bodies: dict[str, bytes], *, gap: float = 0.05):
        origin = HeadFirstOrigin(bodies, gap=gap)
        made.append(origin)
        # Through the engine: --small-gets reads a small body that comes after its head whole before
        # answering (fill/small_gets.py), and these fills are to stream.
        node = await make_node(origins=[Origin(host=HOST, upstream=await origin.start())], small_gets=False)
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        made.append(writer)
        return origin, node, reader, writer

    yield start
    for each in made:
        each.close()


async def test_a_connection_whose_fills_stream_comes_back_to_the_fast_path_after_each(head_first):
    bodies = _bodies(3)
    origin, node, reader, writer = await head_first(bodies)
    with capture_logs() as logs:
        for path, body in bodies.items():
            # The miss is led on the fast path; its fill streams, so the handler answers it.
            writer.write(request(path))
            head, got = await asyncio.wait_for(_response(reader), 5)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and got == body
            assert field(head, "X-Nezha-Cache") == "miss"
            await until(lambda: len(node.server._fast_connections()) == 1)  # back once answered
            # The hit after it is the fast path's again.
            writer.write(request(path))
            head, got = await asyncio.wait_for(_response(reader), 5)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and got == body
            assert field(head, "X-Nezha-Cache") == "hit"
    fills = [e for e in logs if e["event"] == "fill_completed"]
    assert len(fills) == 3 and not any(e.get("at_once") for e in fills)  # each streamed
    assert [(e["cache"], bool(e.get("fast"))) for e in completed(logs)] == [("miss", False), ("hit", True)] * 3
    assert sorted(origin.asked) == sorted(bodies)  # each asked once: the second and third misses were led fast
    assert not node.server.runner.server.connections  # aiohttp's handlers all ended and forgotten
    assert len(node.server.gate.open) == 1  # the connection counted once, by the fast path


async def test_what_comes_while_the_connection_goes_back_is_answered_by_the_fast_path(head_first, monkeypatch):
    """Bytes and the client's end that arrive after aiohttp's answer, before its
    read loop has ended, are held and given to the fast path with the connection."""
    from cachenode.front.client_conn import ClientConnection

    give_back = ClientConnection._give_back
    monkeypatch.setattr(ClientConnection, "_give_back",  # a moment between aiohttp's end and the fast path's start
                        lambda self: asyncio.get_running_loop().call_later(0.2, give_back, self))
    bodies = _bodies(1)
    [path] = bodies
    origin, node, reader, writer = await head_first(bodies)
    with capture_logs() as logs:
        writer.write(request(path))
        head, got = await asyncio.wait_for(_response(reader), 5)
        assert field(head, "X-Nezha-Cache") == "miss" and got == bodies[path]
        [conn] = node.server.runner.server.connections
        await until(lambda: conn._returning)  # answered whole: aiohttp's read loop is ending
        assert not node.server._fast_connections()
        writer.write(request(path) * 2)
        writer.write_eof()
        for _ in range(2):
            head, got = await asyncio.wait_for(_response(reader), 5)
            assert field(head, "X-Nezha-Cache") == "hit" and got == bodies[path]
        assert await asyncio.wait_for(reader.read(), 5) == b""  # then closed, as the client ended
    assert [(e["cache"], bool(e.get("fast"))) for e in completed(logs)] == [
        ("miss", False), ("hit", True), ("hit", True)]


async def test_a_request_pipelined_behind_an_unfinished_answer_keeps_the_connection_with_aiohttp(head_first):
    bodies = _bodies(2)
    first, second = bodies
    origin, node, reader, writer = await head_first(bodies)
    origin.held.add(first)
    with capture_logs() as logs:
        writer.write(request(first))
        await until(lambda: not node.server._fast_connections())  # its fill streams: handed to aiohttp
        writer.write(request(second))  # while the first answer is not finished
        await writer.drain()
        await until(lambda: node.server.runner.server.connections[0]._messages)
        origin.release.set()
        for path in (first, second):
            head, got = await asyncio.wait_for(_response(reader), 5)
            assert field(head, "X-Nezha-Cache") == "miss" and got == bodies[path]
        writer.write(request(first))  # a hit, answered by aiohttp: the connection stayed
        head, got = await asyncio.wait_for(_response(reader), 5)
        assert field(head, "X-Nezha-Cache") == "hit" and got == bodies[first]
    assert not node.server._fast_connections()
    assert [(e["cache"], bool(e.get("fast"))) for e in completed(logs)] == [
        ("miss", False), ("miss", False), ("hit", False)]


async def test_requests_pipelined_with_the_one_handed_over_keep_the_connection_with_aiohttp(head_first):
    bodies = _bodies(1)
    [path] = bodies
    origin, node, reader, writer = await head_first(bodies)
    with capture_logs() as logs:
        writer.write(request(path) * 3)  # in the fast path's buffer behind the miss when it is handed over
        for cache in ("miss", "hit", "hit"):
            head, got = await asyncio.wait_for(_response(reader), 5)
            assert field(head, "X-Nezha-Cache") == cache and got == bodies[path]
        writer.write(request(path))
        head, got = await asyncio.wait_for(_response(reader), 5)
        assert field(head, "X-Nezha-Cache") == "hit" and got == bodies[path]
    assert not node.server._fast_connections()
    assert not any(e.get("fast") for e in completed(logs)) and len(completed(logs)) == 4


async def test_a_request_with_a_body_keeps_its_connection_with_aiohttp(head_first):
    bodies = _bodies(1)
    [path] = bodies
    origin, node, reader, writer = await head_first(bodies, gap=0)
    writer.write(request(path))  # a miss the fast path answers: the object is stored
    head, got = await asyncio.wait_for(_response(reader), 5)
    assert field(head, "X-Nezha-Cache") == "miss" and got == bodies[path]
    with capture_logs() as logs:
        # A body (here one that happens to read as a request) is aiohttp's to frame: never the fast path's.
        smuggled = request(path)
        writer.write(request(path, f"Content-Length: {len(smuggled)}") + smuggled)
        head, got = await asyncio.wait_for(_response(reader), 5)
        assert field(head, "X-Nezha-Cache") == "hit" and got == bodies[path]
        await asyncio.sleep(0.05)  # room for a wrong give-back and a second answer
        assert not node.server._fast_connections()
        writer.write(request(path))
        head, got = await asyncio.wait_for(_response(reader), 5)
        assert field(head, "X-Nezha-Cache") == "hit" and got == bodies[path]
    assert not node.server._fast_connections()
    assert [(e["cache"], bool(e.get("fast"))) for e in completed(logs)] == [("hit", False), ("hit", False)]


async def test_an_answer_cut_short_never_goes_back_to_the_fast_path(head_first):
    bodies = _bodies(1)
    [path] = bodies
    origin, node, reader, writer = await head_first(bodies)
    origin.cut.add(path)
    writer.write(request(path))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert field(head, "Content-Length") == str(len(bodies[path]))
    got = await asyncio.wait_for(reader.read(), 5)  # until the node ends the connection
    assert len(got) < len(bodies[path]) and bodies[path].startswith(got)
    await asyncio.sleep(0.05)
    assert not node.server._fast_connections()
