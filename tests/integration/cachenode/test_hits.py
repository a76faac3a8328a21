"""Serving stored objects: Range, HEAD, conditionals, the origin's headers kept."""

import pytest

PATH = "/~kriz/cifar-10-python.tar.gz"
BODY = bytes(range(256)) * 1000


@pytest.fixture(params=[(True, True), (True, False), (False, False)],
                ids=["fast-path", "aiohttp-sendfile", "aiohttp-read-write"])
async def warm(request, origin, make_node, session):
    """A node holding PATH, serving plain hits on the fast path, or all in aiohttp
    by sendfile or by the read+write fallback."""
    origin.put(PATH, BODY, headers={"Content-Type": "application/x-gzip"})
    fast, sendfile = request.param
    node = await make_node(sendfile=sendfile, fast_hits=fast)
    await node.get(session, PATH)
    await node.node.settled()
    return node


@pytest.mark.parametrize("header,status,expect,content_range", [
    ("bytes=0-99", 206, BODY[:100], "bytes 0-99/256000"),
    ("bytes=1000-", 206, BODY[1000:], "bytes 1000-255999/256000"),
    ("bytes=-10", 206, BODY[-10:], "bytes 255990-255999/256000"),
    ("bytes=255999-999999", 206, BODY[-1:], "bytes 255999-255999/256000"),
    ("bytes=0-1,5-6", 200, BODY, None),
    ("items=0-1", 200, BODY, None),
])
async def test_single_range_on_a_hit(warm, session, header, status, expect, content_range):
    got_status, headers, got = await warm.get(session, PATH, headers={"Range": header})
    assert got_status == status and got == expect
    assert headers.get("Content-Range") == content_range
    assert headers["X-Nezha-Cache"] == "hit"


async def test_range_past_the_end_is_416_with_the_size(warm, session):
    status, headers, got = await warm.get(session, PATH, headers={"Range": "bytes=300000-"})
    assert status == 416 and headers["Content-Range"] == "bytes */256000"


async def test_hit_keeps_origin_headers(origin, warm, session):
    status, headers, got = await warm.get(session, PATH)
    assert headers["Content-Type"] == "application/x-gzip"
    assert headers["ETag"] == origin.etags[PATH]
    assert headers["Last-Modified"] == "Wed, 01 Jan 2025 00:00:00 GMT"
    assert headers["Content-Length"] == str(len(BODY))


async def test_head_on_a_hit_sends_headers_without_body(warm, session):
    status, headers, got = await warm.get(session, PATH, method="HEAD")
    assert status == 200 and got == b"" and headers["Content-Length"] == str(len(BODY))
    assert headers["X-Nezha-Cache"] == "hit"


async def test_head_on_a_miss_asks_the_origin_and_stores_nothing(origin, make_node, session):
    origin.put(PATH, BODY)
    node = await make_node()
    status, headers, got = await node.get(session, PATH, method="HEAD")
    assert status == 200 and got == b"" and headers["Content-Length"] == str(len(BODY))
    assert len(node.node.store) == 0


async def test_if_none_match_on_a_hit_is_304(origin, warm, session):
    status, headers, got = await warm.get(session, PATH, headers={"If-None-Match": origin.etags[PATH]})
    assert status == 304 and got == b"" and headers["ETag"] == origin.etags[PATH]


async def test_if_modified_since_on_a_hit_is_304(warm, session):
    status, _, _ = await warm.get(session, PATH, headers={"If-Modified-Since": "Thu, 02 Jan 2025 00:00:00 GMT"})
    assert status == 304
    status, _, got = await warm.get(session, PATH, headers={"If-Modified-Since": "Tue, 31 Dec 2024 00:00:00 GMT"})
    assert status == 200 and got == BODY


async def test_if_range_with_another_etag_gets_the_whole_object(warm, session):
    status, _, got = await warm.get(session, PATH, headers={"Range": "bytes=0-9", "If-Range": '"other"'})
    assert status == 200 and got == BODY


async def test_absolute_uri_proxy_form_is_served(origin, warm, session):
    async with session.get(warm.url + PATH, headers={"Host": "127.0.0.1"}, proxy=None) as r:
        assert r.status == 403  # Host alone names no origin
    import asyncio

    host, port = warm.server.host, warm.server.port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET http://www.cs.toronto.edu{PATH} HTTP/1.1\r\nHost: ignored\r\n"
                 "Connection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == BODY


async def test_one_connection_moves_from_fast_path_to_aiohttp_and_stays_correct(origin, make_node, session):
    """Plain hit, then a ranged request with a field the fast path does not take (handed to aiohttp), then
    plain again, pipelined."""
    import asyncio

    origin.put(PATH, BODY)
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    plain = f"GET {PATH} HTTP/1.1\r\nHost: www.cs.toronto.edu\r\n\r\n".encode()
    ranged = (f"GET {PATH} HTTP/1.1\r\nHost: www.cs.toronto.edu\r\nRange: bytes=0-9\r\n"
              "X-Request-Id: 1\r\n\r\n").encode()
    writer.write(plain + ranged + plain)
    await writer.drain()
    bodies = []
    for _ in range(3):
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = int(next(v for k, _, v in (line.partition(": ") for line in head.split("\r\n"))
                          if k.lower() == "content-length"))
        bodies.append((head.split(" ")[1], await reader.readexactly(length)))
    writer.close()
    assert bodies == [("200", BODY), ("206", BODY[:10]), ("200", BODY)]


async def test_fast_path_and_aiohttp_send_the_same_headers_for_a_hit(origin, make_node, session):
    origin.put(PATH, BODY, headers={"Content-Type": "application/x-gzip", "Cache-Control": "max-age=600"})
    fast = await make_node(fast_hits=True)
    slow = await make_node(fast_hits=False, data_dir=fast.node.store.root.parent / "slow")
    import asyncio

    import aiohttp
    from structlog.testing import capture_logs

    seen = []
    for node in (fast, slow):
        await node.get(session, PATH)
        await node.node.settled()
        with capture_logs() as logs:
            # A new connection: the one that carried the miss was handed to aiohttp for good.
            async with aiohttp.ClientSession(auto_decompress=False) as fresh:
                status, headers, body = await node.get(fresh, PATH)
            await asyncio.sleep(0.1)  # the server logs once its write completes
        assert status == 200 and body == BODY
        served_fast = [e for e in logs if e["event"] == "request_completed" and e.get("fast")]
        assert len(served_fast) == (1 if node is fast else 0)
        seen.append({k: v for k, v in headers.items() if k not in ("Date", "Server")})
    assert seen[0] == seen[1]
