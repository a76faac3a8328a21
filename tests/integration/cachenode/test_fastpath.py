"""The fast path answers plain hits itself and never changes what any other request means."""

import asyncio
import hashlib
import logging
import os

import aiohttp
import structlog

from structlog.testing import capture_logs

from cachenode.front.listener import Listener
from tests.integration.cachenode.conftest import logged, until

PATH = "/~kriz/cifar-100-python.tar.gz"
HOST = "www.cs.toronto.edu"


async def _warm(origin, make_node, session, body: bytes, **settings):
    origin.put(PATH, body)
    node = await make_node(**settings)
    await node.get(session, PATH)
    await node.node.settled()
    return node


async def _read_response(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    lines = head.split("\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return lines[0].split(" ")[1], headers, body


async def test_absolute_uri_naming_another_host_is_refused_not_served_from_the_origin_named_in_host(
        origin, make_node, session):
    """Host names an origin but the request line names another host: that host wins, and it is refused."""
    node = await _warm(origin, make_node, session, b"x" * 1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(f"GET http://evil.example{PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
    status, _, body = await _read_response(reader)
    writer.close()
    assert status == "403" and b"evil.example" in body
    assert origin.requests[PATH] == 1


async def test_pipelined_hits_to_a_slow_reader_all_arrive_whole_and_in_order(origin, make_node, session):
    """Requests queued behind a body the client is slow to take are answered in order, none lost."""
    body = bytes(range(256)) * 16384  # 4 MiB: more than the socket takes at once
    node = await _warm(origin, make_node, session, body)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    request = f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    writer.write(request * 40)  # 40 x 60 bytes pipelined, beyond what one body takes to send
    await writer.drain()
    await asyncio.sleep(0.2)  # let the server block on the first body
    digests = []
    for _ in range(40):
        status, headers, got = await _read_response(reader)
        assert status == "200" and headers["x-nezha-cache"] == "hit"
        digests.append(hashlib.sha256(got).hexdigest())
    writer.close()
    assert digests == [hashlib.sha256(body).hexdigest()] * 40
    assert origin.requests[PATH] == 1


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(origin, make_node, session):
    node = await _warm(origin, make_node, session, b"y" * 50_000)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
    writer.write_eof()
    status, _, got = await _read_response(reader)
    assert status == "200" and got == b"y" * 50_000
    assert await reader.read() == b""  # and then the node closes
    writer.close()


async def test_a_client_gone_mid_body_is_logged_once_and_the_node_serves_others(origin, make_node, session):
    body = b"z" * (64 << 20)  # more than the kernel buffers of both sockets take
    node = await _warm(origin, make_node, session, body)
    with capture_logs() as logs:
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        writer.write(f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        await reader.readexactly(1000)
        writer.transport.abort()
        await until(logged(logs, "client_gone"))
    gone = [e for e in logs if e["event"] == "client_gone"]
    done = [e for e in logs if e["event"] == "request_completed"]
    assert len(gone) == 1 and 0 < gone[0]["bytes"] < len(body)
    assert len(done) == 1 and done[0]["broken"] is True
    status, _, got = await node.get(session, PATH)
    assert status == 200 and got == body


async def test_a_hit_evicted_between_lookup_and_open_is_served_by_the_full_handler(origin, make_node, session):
    """The object is evicted after the fast path found it: aiohttp serves the request as a miss."""
    node = await _warm(origin, make_node, session, b"w" * 3000)
    found = node.node.handler.plain_hit

    def evicted_right_after_lookup(raw_target, host_header, scheme="http"):
        hit = found(raw_target, host_header, scheme)
        if hit is not None:
            os.unlink(hit[2])
            asyncio.get_running_loop().create_task(node.node.store.remove(hit[0].key))
        return hit

    node.node.handler.plain_hit = evicted_right_after_lookup
    async with aiohttp.ClientSession(auto_decompress=False) as fresh:  # the warm-up's connection went to aiohttp
        status, headers, got = await node.get(fresh, PATH)
    assert status == 200 and got == b"w" * 3000 and headers["X-Nezha-Cache"] == "miss"
    assert origin.requests[PATH] == 2


async def test_idle_fast_path_connections_are_closed_after_the_idle_timeout(origin, make_node, session, tmp_path):
    node = await _warm(origin, make_node, session, b"v" * 100)
    listener = Listener(node.node, idle_timeout=0.2)
    await listener.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(f"GET {PATH} HTTP/1.1\r\n".encode())  # a head that never ends
        assert await asyncio.wait_for(reader.read(), timeout=15) == b""
        writer.close()
    finally:
        await listener.close()


async def test_fast_path_hits_are_counted_and_logged_once(origin, make_node, session):
    node = await _warm(origin, make_node, session, b"u" * 2000)
    with capture_logs() as logs:
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        writer.write(f"HEAD {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\nGET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n"
                     .encode())
        head = await reader.readuntil(b"\r\n\r\n")  # HEAD: headers only
        assert b"Content-Length: 2000" in head
        status, _, got = await _read_response(reader)
        writer.close()
    assert status == "200" and got == b"u" * 2000
    done = [e for e in logs if e["event"] == "request_completed"]
    assert [(e["method"], e["bytes"], e["cache"], e.get("fast")) for e in done] == [
        ("HEAD", 0, "hit", True), ("GET", 2000, "hit", True)]
    metrics = node.node.metrics.render().decode()
    assert 'nezha_requests_total{cache="hit"} 2.0' in metrics


async def test_pipelined_bytes_behind_an_unread_body_are_bounded(origin, make_node, session):
    """A client that sends and never reads cannot make the node buffer its requests without limit."""
    body = b"b" * (16 << 20)  # more than loopback socket buffers take at once
    node = await _warm(origin, make_node, session, body)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    head = f"HEAD {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    writer.write(f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode() + head * 20000)  # 20000 x 61 bytes
    await asyncio.sleep(0.5)
    (conn,) = node.server._fast_connections()
    assert not conn.transport.is_reading()
    assert len(conn._buf) < 256 << 10  # one read or so, not 20000 requests
    status, _, got = await _read_response(reader)
    assert status == "200" and got == body
    for _ in range(20000):
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
    writer.close()


async def test_many_fast_hits_on_several_connections_are_each_counted_and_logged_once(origin, make_node, session):
    """Plain hits are tallied in plain ints between scrapes: /metrics still counts every one exactly once,
    and each still has its own request_completed line with every field."""
    node = await _warm(origin, make_node, session, b"m" * 3000)
    before = await (await session.get(node.url + "/metrics")).text()
    assert 'nezha_requests_total{cache="hit"} 0.0' in before  # the warming GET was the miss
    request = f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    with capture_logs() as logs:
        for n in (1, 40, 9):  # one connection each, pipelined
            reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
            writer.write(request * n)
            for _ in range(n):
                status, headers, got = await _read_response(reader)
                assert status == "200" and headers["x-nezha-cache"] == "hit" and got == b"m" * 3000
            writer.close()
        metrics = await (await session.get(node.url + "/metrics")).text()
        again = await (await session.get(node.url + "/metrics")).text()
    hits = [e for e in logs if e["event"] == "request_completed" and e.get("fast")]
    assert len(hits) == 50
    assert all({k: e[k] for k in ("method", "host", "path", "status", "cache", "bytes")} ==
               {"method": "GET", "host": HOST, "path": PATH, "status": 200, "cache": "hit", "bytes": 3000}
               and e["ms"] >= 0 for e in hits)
    for text in (metrics, again):  # a scrape settles the tally once; the next adds nothing
        assert 'nezha_requests_total{cache="hit"} 50.0' in text
        assert "nezha_cache_hits_total 50.0" in text
        assert 'nezha_bytes_served_by_source_total{source="disk"} 150000.0' in text
        assert 'nezha_time_to_first_byte_seconds_count{cache="hit"} 50.0' in text


async def test_a_fast_path_connection_holds_no_descriptor_beyond_its_socket(origin, make_node, session):
    """The head goes out with MSG_MORE through the transport's own socket, not a duplicate of it: the
    connection cap counts a socket and an object file per connection (connections.PER_CONNECTION)."""
    node = await _warm(origin, make_node, session, b"d" * 5000)
    request = f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    before = len(os.listdir("/proc/self/fd"))
    conns = []
    for _ in range(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        writer.write(request)
        status, _, got = await _read_response(reader)
        assert status == "200" and got == b"d" * 5000
        conns.append(writer)
    opened = len(os.listdir("/proc/self/fd")) - before
    fast = node.server._fast_connections()
    assert len(fast) == 20 and all(c._sock is not None for c in fast)  # on asyncio's loop: the MSG_MORE path
    assert opened < 50  # client and server socket each: 40 (a duplicate each would make it 60)
    for writer in conns:
        writer.close()


async def test_below_info_level_fast_hits_are_still_counted_every_one(origin, make_node, session):
    """At --log-level warning a plain hit skips building its request_completed line, never its counts."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        node = await _warm(origin, make_node, session, b"w" * 700)
        assert node.node.handler._log_hits is False
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        writer.write(f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode() * 7)
        for _ in range(7):
            status, headers, got = await _read_response(reader)
            assert status == "200" and headers["x-nezha-cache"] == "hit" and got == b"w" * 700
        writer.close()
        metrics = await (await session.get(node.url + "/metrics")).text()
    finally:
        structlog.configure(**old)
    assert 'nezha_requests_total{cache="hit"} 7.0' in metrics
    assert 'nezha_bytes_served_by_source_total{source="disk"} 4900.0' in metrics
