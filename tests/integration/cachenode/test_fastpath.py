"""The fast path answers plain hits itself and never changes what any other request means."""

import asyncio
import hashlib
import logging
import os

import aiohttp
import pytest
import structlog

from structlog.testing import capture_logs

from cachenode.front.listener import Listener
from tests.integration.cachenode.conftest import exchange, logged, until

PATH = "/~kriz/cifar-100-python.tar.gz"
HOST = "www.cs.toronto.edu"


async def _warm(origin, make_node, session, body: bytes, *, headers: dict | None = None, **settings):
    origin.put(PATH, body, headers=headers or {})
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
    found = node.node.handler.plain.plain_hit

    def evicted_right_after_lookup(named):
        hit = found(named)
        if hit is not None:
            os.unlink(hit[2])
            asyncio.get_running_loop().create_task(node.node.store.remove(hit[0].key))
        return hit

    node.node.handler.plain.plain_hit = evicted_right_after_lookup
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
    warming = set(node.server._fast_connections())  # the session's, back from aiohttp after its miss
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    head = f"HEAD {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    writer.write(f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode() + head * 20000)  # 20000 x 61 bytes
    await asyncio.sleep(0.5)
    (conn,) = set(node.server._fast_connections()) - warming
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
    # The 20, and the session's that warmed the object: its miss was led on the fast path (front/fast_misses.py).
    assert len(fast) == 21 and all(c._sock is not None for c in fast)  # on asyncio's loop: the MSG_MORE path
    assert opened < 50  # client and server socket each: 40 (a duplicate each would make it 60)
    for writer in conns:
        writer.close()


async def test_below_info_level_fast_hits_are_still_counted_every_one(origin, make_node, session):
    """At --log-level warning a plain hit skips building its request_completed line, never its counts."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        node = await _warm(origin, make_node, session, b"w" * 700)
        assert node.node.handler.plain._log_hits is False
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


# -- one byte range ----------------------------------------------------------------------------------

RANGED = bytes(range(251)) * 1024  # 257,024 bytes; a shifted range shows
# The whole-body fields S3 sends: a 206 leaves them off on both paths (http/headers.py).
RANGED_FIELDS = {"Content-Type": "application/x-gzip", "Cache-Control": "max-age=600", "Content-MD5": "m",
                 "x-amz-checksum-crc32": "c"}
# A field the fast path does not accept: the same request, answered by the aiohttp handler.
TO_HANDLER = "X-Test-Path: handler\r\n"


def _answer(head: bytes) -> tuple[int, list[tuple[str, str]]]:
    """Status and fields of a response head, in a comparable form (names lowered, sorted), without Date,
    which is the time of the answer on the handler's path."""
    lines = head.decode("latin-1").split("\r\n")
    fields = [(k.lower(), v) for k, _, v in (line.partition(": ") for line in lines[1:] if line)]
    return int(lines[0].split(" ")[1]), sorted(f for f in fields if f[0] != "date")


async def _asked_both_ways(node, request_fields: str, *, method: str = "GET"):
    """The same request on the fast path and, with TO_HANDLER added, through aiohttp: each answer's
    (status, fields, body) and its request_completed line."""
    answers, lines = [], []
    for extra in ("", TO_HANDLER):
        raw = f"{method} {PATH} HTTP/1.1\r\nHost: {HOST}\r\n{request_fields}{extra}\r\n".encode()
        with capture_logs() as logs:
            [(head, body)] = await exchange(node.server.port, raw, methods=(method,))
            await until(logged(logs, "request_completed"))
        answers.append((*_answer(head), body))
        lines.append(next(e for e in logs if e["event"] == "request_completed"))
    return answers, lines


@pytest.mark.parametrize("method,value,expect", [
    ("GET", "bytes=0-99", (0, 100)),
    ("GET", "bytes=1000-", (1000, len(RANGED) - 1000)),
    ("GET", "bytes=-10", (len(RANGED) - 10, 10)),
    ("GET", "bytes=-999999", (0, len(RANGED))),  # a suffix longer than the object: all of it, as a 206
    ("GET", "bytes=257000-999999", (257000, 24)),  # an end past the object's: up to its last byte
    ("GET", "bytes=0-0", (0, 1)),
    ("HEAD", "bytes=100-199", (100, 100)),
])
async def test_one_range_is_answered_by_the_fast_path_exactly_as_by_the_handler(
        origin, make_node, session, method, value, expect):
    """Status, Content-Range, Content-Length, every stored and cache field, and the body are the handler's;
    the access log says 206 with the range's bytes on both paths."""
    node = await _warm(origin, make_node, session, RANGED, headers=RANGED_FIELDS)
    (fast, slow), (fast_line, slow_line) = await _asked_both_ways(node, f"Range: {value}\r\n", method=method)
    start, length = expect
    status, fields, body = fast
    assert (status, body) == (206, RANGED[start:start + length] if method == "GET" else b"")
    assert ("content-range", f"bytes {start}-{start + length - 1}/{len(RANGED)}") in fields
    assert ("content-length", str(length)) in fields and ("x-nezha-cache", "hit") in fields
    assert not {"content-md5", "x-amz-checksum-crc32"} & {name for name, _ in fields}
    assert fast == slow
    assert fast_line.get("fast") is True and "fast" not in slow_line
    for line in (fast_line, slow_line):
        assert (line["status"], line["cache"], line["bytes"]) == (206, "hit", length if method == "GET" else 0)
    assert origin.requests[PATH] == 1


@pytest.mark.parametrize("value,status", [
    ("bytes=300000-", 416),  # past the end: the handler's 416
    ("bytes=-0", 416),
    ("bytes=0-1,5-6", 200),  # several ranges: the handler's whole object
    ("bytes=5-3", 200),  # not a range (RFC 9110 §14.1.1): ignored
    ("items=0-1", 200),
    ("bytes= 0-1", 206),  # a form the fast path leaves to the handler's parser
])
async def test_a_range_the_fast_path_does_not_answer_goes_to_the_handler_unchanged(
        origin, make_node, session, value, status):
    node = await _warm(origin, make_node, session, RANGED, headers=RANGED_FIELDS)
    (fast, slow), (fast_line, _) = await _asked_both_ways(node, f"Range: {value}\r\n")
    assert fast[0] == status and "fast" not in fast_line
    assert fast == slow
    if status == 416:
        assert ("content-range", f"bytes */{len(RANGED)}") in fast[1]


@pytest.mark.parametrize("if_range,status", [
    ("{etag}", 206),  # the stored strong ETag: the range applies
    ('"other"', 200),  # another version: the whole object
    ("W/{etag}", 200),  # a weak ETag never lets a range apply
    ("Wed, 01 Jan 2025 00:00:00 GMT", 206),  # exactly the stored Last-Modified
    ("Wed, 01 Jan 2025 00:00:01 GMT", 200),
    ("not a date", 200),
])
async def test_if_range_on_the_fast_path_follows_the_handlers_rule(origin, make_node, session, if_range, status):
    node = await _warm(origin, make_node, session, RANGED, headers=RANGED_FIELDS)
    value = if_range.format(etag=origin.etags[PATH])
    (fast, slow), (fast_line, slow_line) = await _asked_both_ways(node, f"Range: bytes=10-19\r\nIf-Range: {value}\r\n")
    assert fast[0] == status and fast[2] == (RANGED[10:20] if status == 206 else RANGED)
    assert fast == slow
    assert fast_line.get("fast") is True and fast_line["status"] == slow_line["status"] == status


async def test_ranges_beyond_one_sendfile_leave_whole_from_their_offsets_pipelined_with_plain_hits(
        origin, make_node, session):
    """A range larger than the socket takes at once is finished by sendfile_rest from the range's offset,
    never from the file's start; the requests queued behind it follow in order."""
    body = (bytes(range(251)) * (16 * 1024 * 1024 // 251 + 1))[:16 * 1024 * 1024]
    node = await _warm(origin, make_node, session, body)
    ask = f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n".encode()
    spans = [(1_000_003, 7_000_000), (len(body) - 5_000_000, 5_000_000), (3, 1)]
    raw = b"".join(ask + b"Range: bytes=%d-%d\r\n\r\n" % (s, s + n - 1) for s, n in spans[:2])
    raw += ask + b"\r\n" + ask + b"Range: bytes=3-3\r\n\r\n"
    got = await exchange(node.server.port, raw, responses=4, timeout=30)
    assert [(head.split(b" ")[1], hashlib.sha256(b).hexdigest()) for head, b in got] == [
        (b"206", hashlib.sha256(body[s:s + n]).hexdigest()) for s, n in spans[:2]] + [
        (b"200", hashlib.sha256(body).hexdigest()), (b"206", hashlib.sha256(body[3:4]).hexdigest())]


def _counted(text: str) -> dict[str, float]:
    """The /metrics samples a hit moves: requests by outcome, hits, bytes served, time to first byte."""
    wanted = ("nezha_requests_total{", "nezha_cache_hits_total", "nezha_bytes_served_total",
              "nezha_bytes_served_by_source_total{", "nezha_time_to_first_byte_seconds_count{")
    return {name: float(value) for name, _, value in (line.rpartition(" ") for line in text.splitlines())
            if name.startswith(wanted)}


async def test_ranged_hits_on_the_fast_path_are_counted_as_the_handler_counts_them(origin, make_node, session):
    """Ten ranged hits count the same on /metrics, whichever path answered them: each once, with its bytes."""
    node = await _warm(origin, make_node, session, RANGED)

    async def scrape() -> dict[str, float]:
        return _counted(await (await session.get(node.url + "/metrics")).text())

    before = await scrape()
    deltas = []
    for extra in ("", TO_HANDLER):
        asks = b"".join(f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\nRange: bytes={i * 1000}-{i * 1000 + 499}\r\n"
                        f"{extra}\r\n".encode() for i in range(10))
        with capture_logs() as logs:
            got = await exchange(node.server.port, asks, responses=10)
            await until(lambda: len([e for e in logs if e["event"] == "request_completed"]) == 10)
        assert [b for _, b in got] == [RANGED[i * 1000:i * 1000 + 500] for i in range(10)]
        assert [e.get("fast", False) for e in logs if e["event"] == "request_completed"] == [not extra] * 10
        after = await scrape()
        deltas.append({k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)})
        before = after
    assert deltas[0]['nezha_requests_total{cache="hit"}'] == 10
    assert deltas[0]['nezha_bytes_served_by_source_total{source="disk"}'] == 5000
    assert deltas[0] == deltas[1]
