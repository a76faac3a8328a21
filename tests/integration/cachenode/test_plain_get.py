"""The origin client's body-less GETs, written by the node itself on the
session's connector (cachenode/fill/plain_get.py), against real origins: the
same request bytes a session sends, connections kept alive and reused, a
kept-alive connection the origin closed retried once and only once, TLS
verified, no cookie ever sent back, 1xx answers heard, chunked answers
read, and a body cut short never stored."""

from __future__ import annotations

import asyncio
import ssl
from typing import Callable

import aiohttp
import pytest
import trustme
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from cachenode.fill.origin import OriginClient
from nezha.config import Origin
from nezha.errors import OriginError

HOST = "www.cs.toronto.edu"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"



class Cut(bytes):
    """An answer written, then its connection closed: a body shorter than its length is cut there."""


# (connection number, request number on it, head) -> bytes to answer (Cut: then close), or None: close unanswered
Script = Callable[[int, int, bytes], bytes | None]


class RawOrigin:
    """An origin on a plain asyncio server: every request head kept as the
    bytes that came (with the connection it came on), answered by `script`."""

    def __init__(self, script: Script = lambda c, n, head: OK) -> None:
        self.script = script
        self.heads: list[tuple[int, bytes]] = []
        self.connections = 0
        self.url = ""
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> RawOrigin:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn, n = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n += 1
                self.heads.append((conn, head))
                answer = self.script(conn, n, head)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if isinstance(answer, Cut):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw():
    origins: list[RawOrigin] = []

    async def make(script: Script = lambda c, n, head: OK) -> RawOrigin:
        origins.append(await RawOrigin(script).start())
        return origins[-1]

    yield make
    for o in origins:
        await o.close()


@pytest.fixture
async def client():
    c = OriginClient(connect_timeout=2, read_timeout=2)
    await c.start()
    yield c
    await c.close()


async def get(client: OriginClient, url: str, headers=None, **kw) -> tuple[int, bytes]:
    response = await client.request("GET", url, headers=headers or {}, what=f"origin {url}", **kw)
    try:
        return response.status, await response.read()
    finally:
        response.release()


@pytest.fixture
def no_session_requests(monkeypatch):
    """The session's request machinery fails the test if anything uses it."""
    async def refused(*args, **kwargs):
        raise AssertionError("a body-less GET went through ClientSession._request")

    monkeypatch.setattr(aiohttp.ClientSession, "_request", refused)


@pytest.mark.parametrize("headers", [
    {},
    {"Accept": "image/*", "Via": "1.1 node-a"},
    CIMultiDict([("X-Amz-Meta", "1"), ("Via", "1.1 node-a"), ("X-Amz-Meta", "2"), ("accept", "x/y")]),
    CIMultiDict([("X-A", "1"), ("x-a", "2"), ("X-A", "3")]),  # one name spelt two ways: a session's merge
    CIMultiDict([("Host", "images.example"), ("X-Nezha-From-Child", "1")]),  # the parent tier's request
    {"Cookie": "mine=1", "Authorization": "Bearer t", "Max-Forwards": "3"},
])
@pytest.mark.parametrize("target", ["/a.jpg", "/d/1/a%27b%28c%29.bin?x=%2F&sig=A%2Bb"])
async def test_a_plain_get_sends_the_bytes_a_session_would_send(raw, client, headers, target):
    origin = await raw()
    url = origin.url + target
    # The client's own session, as it sent every GET before (its settings: no cookie jar, no User-Agent, ...).
    async with client._session.request("GET", URL(url, encoded=True), headers=headers, allow_redirects=False) as r:
        assert r.status == 200
    assert await get(client, url, headers) == (200, b"ok")
    (_, by_session), (_, by_node) = origin.heads
    assert by_node == by_session


async def test_a_plain_get_goes_around_the_sessions_request(raw, client, no_session_requests):
    origin = await raw()
    assert await get(client, origin.url + "/a") == (200, b"ok")
    assert len(origin.heads) == 1


async def test_gets_reuse_one_kept_alive_connection(raw, client, no_session_requests):
    origin = await raw()
    for name in "abc":
        assert await get(client, f"{origin.url}/{name}") == (200, b"ok")
    assert [conn for conn, _ in origin.heads] == [1, 1, 1]


async def test_a_kept_alive_connection_the_origin_closed_is_retried_once_on_a_new_one(raw, client,
                                                                                  no_session_requests):
    # The origin drops its first connection as the second request arrives on it (its keep-alive ran out).
    origin = await raw(lambda conn, n, head: None if (conn, n) == (1, 2) else OK)
    assert await get(client, origin.url + "/a") == (200, b"ok")
    assert await get(client, origin.url + "/b") == (200, b"ok")
    assert [(conn, head.split(b" ")[1]) for conn, head in origin.heads] == [(1, b"/a"), (1, b"/b"), (2, b"/b")]


async def test_a_kept_alive_connection_the_origin_closed_while_idle_is_not_used_again(raw, client,
                                                                                    no_session_requests):
    # The origin closes each connection once it has answered, saying nothing (its idle timeout).
    origin = await raw(lambda conn, n, head: Cut(OK))
    assert await get(client, origin.url + "/a") == (200, b"ok")
    await asyncio.sleep(0.1)  # its close has reached the node
    assert await get(client, origin.url + "/b") == (200, b"ok")
    assert [(conn, head.split(b" ")[1]) for conn, head in origin.heads] == [(1, b"/a"), (2, b"/b")]


async def test_a_get_whose_retry_breaks_too_is_not_retried_again_and_names_the_error(raw, client,
                                                                                 no_session_requests):
    origin = await raw(lambda conn, n, head: None)
    with pytest.raises(OriginError) as e:
        await get(client, origin.url + "/a")
    assert str(e.value) == f"origin {origin.url}/a: ServerDisconnectedError: Server disconnected"
    assert [conn for conn, _ in origin.heads] == [1, 2]


async def test_a_refused_connect_is_an_origin_error_naming_it(client, no_session_requests):
    with pytest.raises(OriginError, match=r"^origin http://127.0.0.1:9/a: cannot connect: \[Errno 111\] Connect call failed"):
        await get(client, "http://127.0.0.1:9/a")


async def test_a_silent_origin_is_an_origin_timeout_naming_the_timeouts(raw, no_session_requests):
    origin = await raw(lambda conn, n, head: b"")  # reads the request, never answers
    client = OriginClient(connect_timeout=0.5, read_timeout=0.3)
    await client.start()
    try:
        with pytest.raises(OriginError, match=r"no answer within the timeout \(connect 0.5s, read 0.3s\)"):
            await get(client, origin.url + "/a")
    finally:
        await client.close()
    assert len(origin.heads) == 1  # a timeout is not a broken connection: not sent again


async def test_a_cookie_the_origin_sets_is_never_sent_back(raw, client, no_session_requests):
    origin = await raw(lambda conn, n, head: (b"HTTP/1.1 200 OK\r\nSet-Cookie: session=secret; Path=/\r\n"
                                              b"Content-Length: 2\r\n\r\nok"))
    url = origin.url.replace("127.0.0.1", "localhost")  # a name: a cookie jar keeps none for an address
    for name in "ab":
        assert await get(client, f"{url}/{name}") == (200, b"ok")
    assert all(b"cookie" not in head.lower() for _, head in origin.heads)


async def test_interim_answers_are_heard_before_the_final_one(raw, client, no_session_requests):
    origin = await raw(lambda conn, n, head: (b"HTTP/1.1 100 Continue\r\n\r\n"
                                              b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n" + OK))
    heard: list[tuple[int, str, list[tuple[str, str]]]] = []

    async def listener(status: int, reason: str, fields: list[tuple[str, str]]) -> None:
        heard.append((status, reason, fields))

    assert await get(client, origin.url + "/a", interim=listener) == (200, b"ok")
    assert heard == [(103, "Early Hints", [("Link", "</s.css>; rel=preload")])]


async def test_a_chunked_answer_is_read_whole_and_its_connection_kept(raw, client, no_session_requests):
    origin = await raw(lambda conn, n, head: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                              b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"))
    assert await get(client, origin.url + "/a") == (200, b"hello world")
    assert await get(client, origin.url + "/b") == (200, b"hello world")
    assert [conn for conn, _ in origin.heads] == [1, 1]


async def test_a_body_cut_short_is_a_payload_error_and_its_connection_not_reused(raw, client, no_session_requests):
    origin = await raw(lambda conn, n, head: Cut(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
                       if conn == 1 else OK)
    response = await client.request("GET", origin.url + "/a", headers={}, what="origin")
    assert response.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await response.read()
    response.release()
    assert await get(client, origin.url + "/b") == (200, b"ok")
    assert [conn for conn, _ in origin.heads] == [1, 2]


@pytest.fixture
def https_app() -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=b"tls", headers={"Cache-Control": "max-age=60"})

    app = web.Application()
    app.router.add_get("/{name}", answer)
    return app


async def test_a_tls_origin_is_verified_against_its_bundle_and_its_connection_reused(
        aiohttp_server, https_app, tmp_path, no_session_requests):
    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    peers: list[object] = []

    @web.middleware
    async def note(request: web.Request, handler):
        peers.append(request.transport.get_extra_info("peername"))
        return await handler(request)

    https_app.middlewares.append(note)
    server = await aiohttp_server(https_app, host="127.0.0.1", ssl=ctx)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    client = OriginClient(connect_timeout=2, read_timeout=2, roots={("127.0.0.1", server.port): bundle})
    await client.start()
    try:
        for name in "ab":
            assert await get(client, f"https://127.0.0.1:{server.port}/{name}") == (200, b"tls")
    finally:
        await client.close()
    assert len(peers) == 2 and peers[0] == peers[1]


async def test_a_tls_origin_whose_certificate_does_not_verify_is_refused_naming_why(
        aiohttp_server, https_app, client, no_session_requests):
    ca = trustme.CA()  # trusted by nobody
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    asked: list[str] = []

    @web.middleware
    async def note(request: web.Request, handler):
        asked.append(request.path)
        return await handler(request)

    https_app.middlewares.append(note)
    server = await aiohttp_server(https_app, host="127.0.0.1", ssl=ctx)
    url = f"https://127.0.0.1:{server.port}/a"
    with pytest.raises(OriginError, match=r"its TLS certificate does not verify: (self.signed|unable to get local "
                                          r"issuer) certificate"):
        await get(client, url)
    assert asked == []


@pytest.mark.parametrize("size", [16 * 1024, 300 * 1024])  # stored at once when whole, else streamed
async def test_an_origin_dying_mid_body_is_never_stored_and_the_next_read_refetches(raw, make_node, session, size):
    body = bytes(range(256)) * (size // 256)
    head = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: %d\r\n\r\n" % size
    # The first answer stops at a quarter of its body and its connection closes.
    origin = await raw(lambda conn, n, _: Cut(head + body[:size // 4]) if conn == 1 else head + body)
    node = await make_node(origins=[Origin(host=HOST, upstream=origin.url)])
    try:
        async with session.get(node.url + "/a.bin", headers={"Host": HOST}) as r:
            got = await r.read()
        assert len(got) < size, "a cut answer went out whole"
    except aiohttp.ClientPayloadError:
        pass
    await node.node.settled()
    assert len(node.node.store) == 0
    status, headers, got = await node.get(session, "/a.bin")
    assert status == 200 and got == body and headers["X-Nezha-Cache"] == "miss"
    assert [conn for conn, _ in origin.heads] == [1, 2]
