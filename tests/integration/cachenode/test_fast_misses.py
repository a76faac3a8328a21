"""Plain cold misses led below aiohttp (cachenode/front/fast_misses.py,
front/leading.py): a keep-alive connection whose requests are all misses
stays on the fast path; the origin is asked once per key, whoever asks; an
answer the fast path does not send itself goes to the handler with the
connection, never asked again; a dead or malformed origin is a 502 or 504
naming it, with one log line; a client that goes away does not stop the fill."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

from structlog.testing import capture_logs

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST, until

BODY = os.urandom(16 * 1024)


def request(path: str, *extra: str) -> bytes:
    return "".join([f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n", *(f"{line}\r\n" for line in extra), "\r\n"]).encode()


def field(head: bytes, name: str) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.decode().lower() == name.lower():
            return v.strip().decode("latin-1")
    return None


def completed(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "request_completed"]


async def test_a_keep_alive_connection_of_cold_misses_is_answered_below_aiohttp_with_exact_bytes(
        origin, make_node):
    bodies = {f"/d/{n}.bin": os.urandom(16 * 1024 + n) for n in range(5)}
    for path, body in bodies.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    with capture_logs() as logs:
        for path, body in bodies.items():
            writer.write(request(path))
            head, got = await asyncio.wait_for(_response(reader), 5)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and got == body
            assert field(head, "X-Nezha-Cache") == "miss" and field(head, "Content-Length") == str(len(body))
    writer.close()
    lines = completed(logs)
    assert len(lines) == 5 and all(e.get("fast") and e["cache"] == "miss" and e["status"] == 200 for e in lines)
    assert [e["bytes"] for e in lines] == [len(b) for b in bodies.values()]
    assert len(node.server._fast_connections()) == 1  # never handed to aiohttp
    assert all(origin.requests[path] == 1 for path in bodies)


async def test_a_fast_miss_answer_carries_the_fields_the_handlers_miss_answer_carries(origin, make_node):
    origin.put("/a.bin", BODY, headers={"Cache-Control": "max-age=3600", "X-Origin": "kept"})
    origin.put("/b.bin", BODY, headers={"Cache-Control": "max-age=3600", "X-Origin": "kept"})
    node = await make_node()
    [(fast, body_fast)] = await _exchange(node, request("/a.bin"))
    # A field off the fast path's allow-list sends the request through aiohttp and the handler.
    [(handled, body_handled)] = await _exchange(node, request("/b.bin", "X-Client: 1"))
    assert body_fast == body_handled == BODY

    def fields(head: bytes) -> set[tuple[str, str]]:
        out = set()
        for line in head.split(b"\r\n")[1:]:
            if line:
                k, _, v = line.decode("latin-1").partition(":")
                out.add((k.lower(), v.strip()))
        # aiohttp's own: its Server field, and Date is each answer's origin Date.
        return {(k, v) for k, v in out if k not in ("server", "date")}

    assert fields(fast) == fields(handled)
    assert field(fast, "Date") is not None


async def _exchange(node, data: bytes, n: int = 1) -> list[tuple[bytes, bytes]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    try:
        writer.write(data)
        return [await asyncio.wait_for(_response(reader), 5) for _ in range(n)]
    finally:
        writer.close()


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One response: its head and body, by Content-Length or chunked."""
    head = await reader.readuntil(b"\r\n\r\n")
    if (field(head, "Transfer-Encoding") or "").lower() != "chunked":
        return head, await reader.readexactly(int(field(head, "Content-Length") or 0))
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readuntil(b"\r\n")
    return head, body


async def test_concurrent_plain_misses_of_one_key_cost_the_origin_one_request_led_on_the_fast_path(
        origin, make_node):
    origin.put("/same.bin", BODY, delay=0.3, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    with capture_logs() as logs:
        answers = await asyncio.gather(*(_exchange(node, request("/same.bin")) for _ in range(12)))
    assert origin.requests["/same.bin"] == 1
    assert all(body == BODY for [(_, body)] in answers)
    labels = sorted(field(head, "X-Nezha-Cache") for [(head, _)] in answers)
    assert labels.count("miss") == 1 and set(labels) <= {"miss", "miss-joined", "hit"}
    [led] = [e for e in completed(logs) if e["cache"] == "miss"]
    assert led.get("fast")  # the leader was answered below aiohttp; its joiners by the handler
    assert len(completed(logs)) == 12


async def test_answers_the_fast_path_does_not_send_go_to_the_handler_without_a_second_origin_request(
        origin, make_node):
    large = os.urandom(300 * 1024)  # beyond small_object_max: a fill that streams
    origin.put("/large.bin", large, headers={"Cache-Control": "max-age=3600"})
    origin.put("/cookie.bin", BODY, headers={"Set-Cookie": "s=1"})  # passed on, never stored
    origin.put("/chunked.bin", BODY, chunked=True, headers={"Cache-Control": "max-age=3600"})
    origin.put("/gone.bin", b"not here\n", status=404)
    node = await make_node()
    with capture_logs() as logs:
        for path, body, status, cache in (("/large.bin", large, 200, "miss"), ("/cookie.bin", BODY, 200, "pass"),
                                          ("/chunked.bin", BODY, 200, "miss"), ("/gone.bin", b"not here\n", 404,
                                                                                 None)):
            [(head, got)] = await _exchange(node, request(path))
            assert int(head.split(b" ")[1]) == status and got == body, path
            assert origin.requests[path] == 1, path
            if cache is not None:
                assert field(head, "X-Nezha-Cache") == cache, path
            assert field(head, "Set-Cookie") == ("s=1" if path == "/cookie.bin" else None)
    lines = completed(logs)
    assert len(lines) == 4 and not any(e.get("fast") for e in lines)  # each answered by the handler, once
    [(head, got)] = await _exchange(node, request("/large.bin"))
    assert field(head, "X-Nezha-Cache") == "hit" and got == large and origin.requests["/large.bin"] == 1


async def test_a_dead_origin_is_a_502_naming_it_with_one_log_line(origin, make_node):
    node = await make_node(origins=[Origin(host=HOST, upstream="http://127.0.0.1:9")])  # nothing listens
    with capture_logs() as logs:
        [(head, body)] = await _exchange(node, request("/x.bin"))
    assert head.startswith(b"HTTP/1.1 502 ") and b"127.0.0.1:9" in body
    [line] = completed(logs)
    assert (line["status"], line["cache"]) == (502, "error")


async def test_a_silent_origin_is_a_504_naming_the_timeout(make_node, silent_server):
    where = await silent_server()
    node = await make_node(origins=[Origin(host=HOST, upstream=f"http://{where}")], origin_read_timeout=0.3)
    with capture_logs() as logs:
        [(head, body)] = await _exchange(node, request("/x.bin"))
    assert head.startswith(b"HTTP/1.1 504 ") and b"no answer within the timeout" in body
    [line] = completed(logs)
    assert (line["status"], line["cache"]) == (504, "error")


async def test_a_malformed_origin_answer_is_a_502_naming_what_was_wrong(make_node):
    async def lie(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: twelve\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(lie, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        node = await make_node(origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{port}")])
        with capture_logs() as logs:
            [(head, body)] = await _exchange(node, request("/x.bin"))
        assert head.startswith(b"HTTP/1.1 502 ") and f"127.0.0.1:{port}".encode() in body
        [line] = completed(logs)
        assert (line["status"], line["cache"]) == (502, "error")
    finally:
        server.close()
        await server.wait_closed()


async def test_a_client_gone_mid_fill_leaves_the_object_stored_and_says_so_once(origin, make_node):
    origin.put("/slow.bin", BODY, delay=0.3, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    with capture_logs() as logs:
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        # Reset on close: the node's answer finds the connection gone (a plain close is seen only later).
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.write(request("/slow.bin"))
        await writer.drain()
        await until(lambda: origin.requests["/slow.bin"] == 1)
        writer.close()  # gone before the origin answered
        await until(lambda: any(e["event"] == "request_completed" for e in logs), timeout=5)
    assert [e["event"] for e in logs if e["event"] in ("client_gone", "request_completed")] == \
        ["client_gone", "request_completed"]
    [line] = completed(logs)
    assert line["cache"] == "miss" and line["bytes"] == 0 and line.get("broken")
    [(head, got)] = await _exchange(node, request("/slow.bin"))
    assert field(head, "X-Nezha-Cache") == "hit" and got == BODY and origin.requests["/slow.bin"] == 1


async def test_fast_misses_move_the_counters_the_handler_moves(origin, make_node, session):
    for n in range(3):
        origin.put(f"/c/{n}.bin", BODY, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    for n in range(3):
        await _exchange(node, request(f"/c/{n}.bin"))
    text = await (await session.get(node.url + "/metrics")).text()
    assert 'nezha_requests_total{cache="miss"} 3.0' in text
    assert "nezha_cache_misses_total 3.0" in text
    assert f"nezha_bytes_served_total {3.0 * len(BODY)}" in text
    assert 'nezha_time_to_first_byte_seconds_count{cache="miss"} 3.0' in text


async def test_requests_pipelined_behind_a_led_miss_are_held_to_a_bounded_backlog_then_answered(origin, make_node):
    from cachenode.front.leading import LEADING_BACKLOG

    origin.put("/slow.bin", BODY, delay=0.5, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    behind = request("/slow.bin")
    writer.write(request("/slow.bin") + behind * (16 * LEADING_BACKLOG // len(behind)))
    (conn,) = node.server._fast_connections()
    await until(lambda: conn._leading and not conn.transport.is_reading())  # stopped reading while it leads
    assert conn._leading and len(conn._buf) <= LEADING_BACKLOG + (1 << 18)  # at most a read's worth beyond
    head, got = await asyncio.wait_for(_response(reader), 5)
    assert field(head, "X-Nezha-Cache") == "miss" and got == BODY
    for _ in range(3):  # the rest are hits of the object just stored, in order
        head, got = await asyncio.wait_for(_response(reader), 5)
        assert field(head, "X-Nezha-Cache") == "hit" and got == BODY
    writer.close()
    assert origin.requests["/slow.bin"] == 1


async def test_each_variant_a_plain_request_selects_is_led_and_stored_apart(origin, make_node):
    """Accept-Encoding is a plain request's field: a response that varies on it is
    looked up per variant before a miss is led, so each variant is asked once."""
    origin.put("/v.bin", BODY, headers={"Cache-Control": "max-age=3600", "Vary": "Accept-Encoding"})
    node = await make_node()
    with capture_logs() as logs:
        for encoding, cache in (("gzip", "miss"), ("br", "miss"), ("gzip", "hit"), ("br", "hit")):
            [(head, got)] = await _exchange(node, request("/v.bin", f"Accept-Encoding: {encoding}"))
            assert (field(head, "X-Nezha-Cache"), got) == (cache, BODY), encoding
    assert origin.requests["/v.bin"] == 2
    # Both misses led below aiohttp (a varying object's hits are the handler's: it selects the variant).
    assert [e["cache"] for e in completed(logs) if e.get("fast")] == ["miss", "miss"]
