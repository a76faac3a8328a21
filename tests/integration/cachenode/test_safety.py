"""Not an open proxy; no path escapes the data directory; bad requests are refused clearly."""

import asyncio

import pytest
from structlog.testing import capture_logs


async def raw_request(node, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(node.server.host, node.server.port)
    writer.write(request)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_unknown_host_is_403_naming_the_host_and_origin_never_contacted(origin, make_node, session):
    origin.put("/x", b"x")
    node = await make_node()
    status, _, body = await node.get(session, "/x", host="evil.example.com")
    assert status == 403 and b"'evil.example.com' is not a configured origin" in body
    status, body = await raw_request(node, b"GET http://evil.example.com/x HTTP/1.1\r\nHost: www.cs.toronto.edu\r\n"
                                           b"Connection: close\r\n\r\n")
    assert status == 403 and b"evil.example.com" in body
    assert sum(origin.requests.values()) == 0


@pytest.mark.parametrize("host,named", [("my_bucket.example.com", "my_bucket.example.com"), ("[::1]", "[::1]"),
                                        ("127.0.0.1:22", "127.0.0.1")])
async def test_hosts_that_no_origin_can_have_are_403_naming_them(origin, make_node, host, named):
    """An underscore, an IP literal, an address: not a configured origin, so refused like any other."""
    origin.put("/x", b"x")
    node = await make_node()
    status, body = await raw_request(node, f"GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    assert status == 403 and named.encode() in body and b"not an open proxy" in body
    assert sum(origin.requests.values()) == 0


@pytest.mark.parametrize("target", [
    b"/../../etc/passwd", b"/a/%2e%2e/%2E%2E/etc/passwd", b"/a/..%2f..%2fetc", b"/a/..\\..\\etc",
    b"/./x",
])
async def test_path_traversal_attempts_are_400_and_touch_nothing(origin, make_node, target, tmp_path):
    node = await make_node()
    status, body = await raw_request(node, b"GET " + target + b" HTTP/1.1\r\nHost: www.cs.toronto.edu\r\n"
                                                             b"Connection: close\r\n\r\n")
    assert status == 400 and b"dot segment" in body
    assert sum(origin.requests.values()) == 0
    assert {p.name for p in tmp_path.iterdir()} <= {"node"}


async def test_stored_files_are_named_by_hash_inside_the_data_dir(origin, make_node, session, tmp_path):
    origin.put("/weird%2Fname;x=..", b"w" * 100)
    node = await make_node()
    status, _, got = await node.get(session, "/weird%2Fname;x=..")
    assert status == 200
    await node.node.settled()
    root = node.node.store.root
    for p in root.rglob("*"):
        assert root in p.resolve().parents
        assert "weird" not in p.name


async def test_connect_and_trace_are_refused_with_405_naming_why(origin, make_node, session):
    node = await make_node()
    for method, why in (("TRACE", b"does not echo"), ("CONNECT", b"not a tunnel")):
        target = "www.cs.toronto.edu:443" if method == "CONNECT" else "/x"
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: www.cs.toronto.edu\r\nContent-Length: 0\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 405"), head
        assert b"CONNECT" not in head.split(b"Allow:")[1].split(b"\r\n")[0]
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        assert why in await reader.readexactly(length)
        writer.close()
    assert sum(origin.requests.values()) == 0


@pytest.mark.parametrize("target, host, port", [("www.cs.toronto.edu:443", "www.cs.toronto.edu", 443),
                                                ("[::1]:8443", "::1", 8443)])
async def test_a_refused_connect_is_logged_with_the_host_and_port_it_asked_for(origin, make_node, target, host, port):
    """A CONNECT names where it wants to go in its request line, not in a path or its Host field."""
    node = await make_node()
    with capture_logs() as logs:
        status, _ = await raw_request(node, f"CONNECT {target} HTTP/1.1\r\nHost: other.example\r\n"
                                            f"Connection: close\r\n\r\n".encode())
    assert status == 405
    [line] = [e for e in logs if e["event"] == "request_completed"]
    assert (line["method"], line["host"], line["port"], line["status"]) == ("CONNECT", host, port, 405)


async def test_a_refused_trace_is_logged_with_the_host_it_named(origin, make_node):
    """A TRACE is refused before routing, yet its line names the host its Host field gave."""
    node = await make_node()
    with capture_logs() as logs:
        status, _ = await raw_request(node, b"TRACE /x HTTP/1.1\r\nHost: www.cs.toronto.edu\r\nConnection: close\r\n\r\n")
    assert status == 405
    [line] = [e for e in logs if e["event"] == "request_completed"]
    assert (line["method"], line["host"], line["status"]) == ("TRACE", "www.cs.toronto.edu", 405)


async def test_admin_endpoints_answer_on_a_non_origin_host(origin, make_node, session):
    origin.put("/f", b"f" * 1000)
    node = await make_node()
    await node.get(session, "/f")
    await node.node.settled()
    await node.get(session, "/f")
    async with session.get(node.url + "/healthz") as r:
        assert r.status == 200
    async with session.get(node.url + "/readyz") as r:
        assert r.status == 200 and (await r.json())["objects"] == 1
    async with session.get(node.url + "/metrics") as r:
        text = await r.text()
    assert "nezha_cache_hits_total 1.0" in text and "nezha_cache_misses_total 1.0" in text
    assert "nezha_bytes_served_total 2000.0" in text  # the miss streamed 1000, the hit 1000
    assert "nezha_bytes_from_origin_total 1000.0" in text


async def test_dataset_path_named_metrics_is_a_dataset_request(origin, make_node, session):
    origin.put("/metrics", b"dataset metrics file")
    node = await make_node()
    status, _, got = await node.get(session, "/metrics")
    assert got == b"dataset metrics file"
