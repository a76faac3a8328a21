"""The node's own client for small answers of plain http:// origins
(cachenode/fill/small_gets.py), against a raw origin answering byte by byte:
a final 200 with a Content-Length read whole however it arrives, connections
kept alive only when the answer allows, everything else declined (None)
with its connection closed, and the request bytes those of `PlainGets`."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import pytest
from multidict import CIMultiDict
from yarl import URL

from cachenode.fill.origin import OriginClient
from cachenode.fill.plain_get import request_fields, request_head
from cachenode.fill.small_gets import SmallGets

BODY = bytes(range(256)) * 64  # 16 KiB
OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: \"a\"\r\n\r\n" % len(BODY) + BODY

# (connection number, request number on it, head, writer) -> False: close the connection after
Script = Callable[[int, int, bytes, asyncio.StreamWriter], Awaitable[bool]]


def answering(*answers: bytes, close: bool = False) -> Script:
    """Write each of `answers` in turn (a piece each, drained), then close when `close`."""

    async def script(conn: int, n: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        for piece in answers:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)
        return not close

    return script


def held_until(gate: asyncio.Event) -> Script:
    """Answer OK once `gate` is set: an exchange kept busy for as long as a test needs."""

    async def script(conn: int, n: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        await gate.wait()
        writer.write(OK)
        await writer.drain()
        return True

    return script


class RawOrigin:
    def __init__(self, script: Script = answering(OK)) -> None:
        self.script = script
        self.heads: list[tuple[int, bytes]] = []
        self.connections = 0
        self.closed = 0
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> RawOrigin:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self.writers:
            w.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        conn, n = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n += 1
                self.heads.append((conn, head))
                if not await self.script(conn, n, head, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


HEAD = b"GET /a HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n"


@pytest.fixture
async def origin_with():
    made: list[RawOrigin] = []

    async def make(script: Script = answering(OK)) -> RawOrigin:
        origin = await RawOrigin(script).start()
        made.append(origin)
        return origin

    yield make
    for origin in made:
        await origin.close()


async def get(gets: SmallGets, origin: RawOrigin, *, small_max: int = 65536, timeout: float = 5.0):
    return await gets.get("127.0.0.1", origin.port, HEAD, small_max=small_max, timeout=timeout)


async def test_a_200_is_answered_with_its_fields_in_order_and_its_whole_body(origin_with) -> None:
    origin = await origin_with(answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-A: 1\r\nx-a: 2\r\nETag: \"e\"\r\n\r\n" % len(BODY) + BODY))
    gets = SmallGets()
    answer = await get(gets, origin)
    assert answer is not None
    assert (answer.status, answer.reason, answer.content_length, answer.body) == (200, "OK", len(BODY), BODY)
    assert tuple(answer.version) == (1, 1)
    # Named as aiohttp's parser names them: a field it knows as `aiohttp.hdrs` spells it, any other as sent.
    assert list(answer.headers.items()) == [("Content-Length", str(len(BODY))), ("X-A", "1"), ("x-a", "2"),
                                            ("Etag", '"e"')]
    assert answer.headers.getall("x-a") == ["1", "2"]
    assert answer.field_lines() is answer.field_lines()
    assert answer.field_lines().lines("etag") == ['"e"']
    assert answer.field_lines().pairs == tuple(answer.headers.items())
    assert answer.field_lines().by_name() == {"content-length": [str(len(BODY))], "x-a": ["1", "2"], "etag": ['"e"']}
    gets.close()


async def test_a_head_and_body_in_many_pieces_are_read_whole(origin_with) -> None:
    pieces = [OK[i:i + 7] for i in range(0, 119, 7)] + [OK[119 + i:119 + i + 4000] for i in range(0, len(OK) - 119, 4000)]
    assert b"".join(pieces) == OK
    origin = await origin_with(answering(*pieces))
    gets = SmallGets()
    answer = await get(gets, origin)
    assert answer is not None and answer.body == BODY
    gets.close()


async def test_keep_alive_answers_reuse_one_connection(origin_with) -> None:
    origin = await origin_with()
    gets = SmallGets()
    for _ in range(5):
        answer = await get(gets, origin)
        assert answer is not None and answer.body == BODY
    assert origin.connections == 1 and len(origin.heads) == 5
    assert gets.opened("127.0.0.1", origin.port) == 1
    gets.close()


async def test_an_answer_saying_connection_close_is_not_reused(origin_with) -> None:
    origin = await origin_with(answering(OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)))
    gets = SmallGets()
    for _ in range(3):
        answer = await get(gets, origin)
        assert answer is not None and answer.body == BODY
    assert origin.connections == 3
    assert gets.opened("127.0.0.1", origin.port) == 0
    gets.close()


async def test_http_1_0_is_answered_and_reused_only_with_keep_alive(origin_with) -> None:
    plain10 = OK.replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    origin = await origin_with(answering(plain10))
    gets = SmallGets()
    for _ in range(2):
        answer = await get(gets, origin)
        assert answer is not None and tuple(answer.version) == (1, 0) and answer.body == BODY
    assert origin.connections == 2
    kept = await origin_with(answering(plain10.replace(b"\r\n\r\n", b"\r\nConnection: Keep-Alive\r\n\r\n", 1)))
    for _ in range(2):
        assert await get(gets, kept) is not None
    assert kept.connections == 1
    # "close" ends the connection whatever else its Connection lists (RFC 9112 §9.3).
    both = await origin_with(answering(plain10.replace(b"\r\n\r\n", b"\r\nConnection: keep-alive, close\r\n\r\n",
                                                         1)))
    for _ in range(2):
        assert await get(gets, both) is not None
    assert both.connections == 2
    gets.close()


async def test_an_idle_connection_is_closed_after_its_idle_time(origin_with) -> None:
    origin = await origin_with()
    gets = SmallGets(idle_max=0.2)
    assert await get(gets, origin) is not None
    assert gets.opened("127.0.0.1", origin.port) == 1
    for _ in range(200):  # the origin hears the close; no fixed sleep to guess
        if origin.closed == 1:
            break
        await asyncio.sleep(0.02)
    assert origin.closed == 1
    assert await get(gets, origin) is not None  # on a new connection, the closed one dropped
    assert origin.connections == 2 and gets.opened("127.0.0.1", origin.port) == 1
    gets.close()


async def test_a_connection_reused_before_its_idle_time_stays_open(origin_with) -> None:
    origin = await origin_with()
    gets = SmallGets(idle_max=0.3)
    for _ in range(5):
        assert await get(gets, origin) is not None
        await asyncio.sleep(0.1)  # each reuse within the idle time: 0.5 s in all on one connection
    assert origin.connections == 1 and origin.closed == 0
    gets.close()


@pytest.mark.parametrize("answer", [
    pytest.param(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK, id="interim_then_200"),
    pytest.param(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno", id="404"),
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", id="chunked"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + b"x" * 70000, id="too_large"),
    pytest.param(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\nok", id="no_length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", id="two_lengths"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", id="negative_length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n folded\r\n\r\nok", id="folded_line"),
    pytest.param(b"HTTP/1.1 200 OK\r\nX-Big: " + b"y" * 70000 + b"\r\nContent-Length: 2\r\n\r\nok", id="huge_head"),
    pytest.param(b"HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\nok", id="bad_status_line"),
    # A line aiohttp's parser refuses (over 8190 bytes): the engine fails it, so it is never stored here.
    pytest.param(b"HTTP/1.1 200 OK\r\nX-Big: " + b"y" * 10000 + b"\r\nContent-Length: 2\r\n\r\nok", id="long_line"),
])
async def test_anything_but_a_small_whole_200_is_declined_and_its_connection_closed(origin_with, answer) -> None:
    origin = await origin_with(answering(answer))
    gets = SmallGets()
    assert await get(gets, origin) is None
    assert gets.opened("127.0.0.1", origin.port) == 0
    assert await get(gets, origin) is None
    assert origin.connections == 2  # never reused after a decline
    gets.close()


async def test_an_origin_closing_mid_body_is_declined_and_its_connection_dropped(origin_with) -> None:
    origin = await origin_with(answering(OK[:5000], close=True))
    gets = SmallGets()
    assert await get(gets, origin) is None
    assert gets.opened("127.0.0.1", origin.port) == 0
    gets.close()


async def test_an_idle_connection_the_origin_closed_is_never_used(origin_with) -> None:
    async def once_then_close(conn: int, n: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK)
        await writer.drain()
        return False  # closed once answered, without saying so

    origin = await origin_with(once_then_close)
    gets = SmallGets()
    assert (await get(gets, origin)).body == BODY  # type: ignore[union-attr]
    for _ in range(100):
        if origin.closed == 1 and gets._idle[("127.0.0.1", origin.port)][0].closed:
            break
        await asyncio.sleep(0.01)
    answer = await get(gets, origin)
    assert answer is not None and answer.body == BODY
    assert origin.connections == 2 and [c for c, _ in origin.heads] == [1, 2]
    assert gets.opened("127.0.0.1", origin.port) == 1  # the first dropped; the second idle till its close is heard
    gets.close()


async def test_a_silent_origin_is_declined_within_the_timeout(origin_with) -> None:
    async def silent(conn: int, n: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK[:100])
        await asyncio.sleep(30)
        return False

    origin = await origin_with(silent)
    gets = SmallGets()
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await get(gets, origin, timeout=0.3) is None
    assert 0.3 <= loop.time() - began < 10
    assert gets.opened("127.0.0.1", origin.port) == 0
    gets.close()


async def test_a_refused_connect_and_a_full_pool_are_declined(origin_with) -> None:
    gets = SmallGets(pool_max=1)
    assert await gets.get("127.0.0.1", 1, HEAD, small_max=65536, timeout=5) is None

    gate = asyncio.Event()
    origin = await origin_with(held_until(gate))
    first = asyncio.create_task(get(gets, origin))
    while not origin.heads:
        await asyncio.sleep(0.01)
    assert await get(gets, origin) is None  # the one connection is busy: no wait
    gate.set()
    assert (await first) is not None
    assert origin.connections == 1
    gets.close()


async def test_the_request_bytes_are_those_plain_gets_sends(origin_with) -> None:
    origin = await origin_with()
    url = URL(f"http://127.0.0.1:{origin.port}/data/a%27b.bin?x=1", encoded=True)
    forwarded = CIMultiDict([("Via", "1.1 node-a"), ("X-Trace", "t1"), ("x-trace", "t2")])
    client = OriginClient(connect_timeout=5, read_timeout=5)
    await client.start()
    try:
        response = await client.request("GET", str(url), headers=forwarded, what="origin")
        await response.read()
        response.release()
    finally:
        await client.close()
    gets = SmallGets()
    head = request_head(url, request_fields(url, forwarded))
    assert (await gets.get("127.0.0.1", origin.port, head, small_max=65536, timeout=5)) is not None
    gets.close()
    assert len(origin.heads) == 2
    assert origin.heads[0][1] == origin.heads[1][1] == head


async def test_a_value_past_ascii_is_read_as_aiohttp_reads_it(origin_with) -> None:
    origin = await origin_with(answering(OK.replace(b"\r\n\r\n", "\r\nX-Note: caf\u00e9 \xff\r\n\r\n".encode(
        "utf-8").replace("\u00ff".encode("utf-8"), b"\xff"), 1)))
    gets = SmallGets()
    answer = await get(gets, origin)
    assert answer is not None and answer.headers["X-Note"] == "caf\u00e9 " + b"\xff".decode("utf-8", "surrogateescape")
    gets.close()


async def test_closing_with_a_get_in_flight_lets_it_end_and_keeps_nothing(origin_with) -> None:
    gate = asyncio.Event()
    origin = await origin_with(held_until(gate))
    gets = SmallGets()
    in_flight = asyncio.create_task(get(gets, origin))
    while not origin.heads:
        await asyncio.sleep(0.01)
    gets.close()
    gate.set()
    answer = await in_flight
    assert answer is not None and answer.body == BODY
    assert gets.opened("127.0.0.1", origin.port) == 0 and not gets._idle  # closed once it ended, not kept


async def test_a_head_and_part_of_its_body_in_one_read_then_the_rest_is_read_whole(origin_with) -> None:
    origin = await origin_with(answering(OK[:1000], OK[1000:9000], OK[9000:]))
    gets = SmallGets()
    for _ in range(2):
        answer = await get(gets, origin)
        assert answer is not None and answer.body == BODY
    assert origin.connections == 1
    gets.close()


async def test_bytes_past_the_answer_in_its_last_read_end_its_connection(origin_with) -> None:
    for pieces in ([OK + b"HTTP/1.1"], [OK[:50], OK[50:] + b"HTTP/1.1"]):
        origin = await origin_with(answering(*pieces))
        gets = SmallGets()
        for _ in range(2):
            answer = await get(gets, origin)
            assert answer is not None and answer.body == BODY
        assert origin.connections == 2  # never reused: the bytes past the answer belong to no exchange
        gets.close()


def answered_then_silent(after: int) -> Script:
    """Answer OK to the first `after` requests of a connection, then never again."""

    async def script(conn: int, n: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        if n > after:
            await asyncio.sleep(30)
            return False
        writer.write(OK)
        await writer.drain()
        return True

    return script


@pytest.mark.parametrize("idle_max, timeout", [(0.2, 0.6), (2.0, 0.3)])
async def test_a_reused_connection_is_declined_after_its_own_timeout_whatever_its_idle_time(
        origin_with, idle_max: float, timeout: float) -> None:
    """The exchange's timeout counts from its request, on a connection that waited idle before it."""
    origin = await origin_with(answered_then_silent(2))
    gets = SmallGets(idle_max=idle_max)
    loop = asyncio.get_running_loop()
    for _ in range(2):
        assert await get(gets, origin, timeout=timeout) is not None
        await asyncio.sleep(0.05)
    began = loop.time()
    assert await get(gets, origin, timeout=timeout) is None
    assert timeout <= loop.time() - began < timeout + 0.15
    assert origin.connections == 1 and gets.opened("127.0.0.1", origin.port) == 0
    gets.close()


async def test_an_exchange_longer_than_the_idle_time_is_answered_and_its_connection_kept(origin_with) -> None:
    async def slow(conn: int, n: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.5)
        writer.write(OK)
        await writer.drain()
        return True

    origin = await origin_with(slow)
    gets = SmallGets(idle_max=0.2)
    for _ in range(2):
        answer = await get(gets, origin, timeout=2)
        assert answer is not None and answer.body == BODY
    assert origin.connections == 1
    for _ in range(100):  # and once idle, closed after its idle time
        if origin.closed == 1:
            break
        await asyncio.sleep(0.02)
    assert origin.closed == 1 and gets.opened("127.0.0.1", origin.port) == 1
    gets.close()


async def test_an_answers_url_is_the_url_asked_as_yarl_reads_it(origin_with) -> None:
    origin = await origin_with()
    gets = SmallGets()
    asked = f"http://127.0.0.1:{origin.port}/data/a%27b.bin?x=1"
    answer = await gets.get("127.0.0.1", origin.port, HEAD, small_max=65536, timeout=5, url=asked)
    assert answer is not None and answer.url == URL(asked, encoded=True) and answer.url is answer.url
    assert (await get(gets, origin)).url is None  # type: ignore[union-attr]
    gets.close()
