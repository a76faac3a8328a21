"""Issue 14, on the wire: what a client connection may cost a node, and what it is always owed.

Each case runs on real sockets against a node on 127.0.0.1, and during each
flood a legitimate client on another connection must be served while the
flood is still held (unread, unanswered): an answer then was not queued
behind the flood. How fast it comes is a benchmark's business; a wait here
only guards against a hang, and a 1 s bound failed on a loaded 2-core box.

- bare-LF request heads are answered 400 at once (they used to be held an hour);
- a request head must arrive within `request_head_timeout`, then 408;
- client connections are capped below the descriptor limit: at the cap the
  stalest waiting connection gives way, and only when all are busy is a
  newcomer answered 503 with Retry-After;
- a client that half-closes after its requests still gets every answer;
- a client that pipelines without reading is held to a bounded backlog.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import time

import pytest

from cachenode.front.connections import default_max_connections
from tests.integration.cachenode.conftest import HOST, exchange, header_line, read_response, until

PATH = "/d/object.bin"
BODY = bytes(range(256)) * 400  # 100 KiB
BIG = b"B" * (16 << 20)  # more than loopback socket buffers take at once


def get(path: str = PATH, *extra: str, method: str = "GET") -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", f"Host: {HOST}", *extra, "", ""]).encode()


async def warm(origin, make_node, session, **settings):
    origin.put(PATH, BODY)
    node = await make_node(**settings)
    assert (await node.get(session, PATH))[2] == BODY
    await node.node.settled()
    return node


# A guard against hanging, not a claim of speed: far below every timer a case relies on not firing (the idle
# timeout, 3630 s; the head timeout where a case sets it to an hour).
GUARD = 30.0


async def served_meanwhile(port: int, path: str = PATH, body: bytes = BODY) -> None:
    """A legitimate client on its own connection gets the whole object while the caller still holds its
    flood (its connections unread or unfinished), so the answer did not wait for the flood to end."""
    [(head, got)] = await exchange(port, get(path), timeout=GUARD)
    assert head.startswith(b"HTTP/1.1 200 ") and got == body


async def read_heads(reader: asyncio.StreamReader, count: int, *, silence: float = 10.0) -> list[bytes]:
    """`count` bodiless response heads, read in bulk: half a million answers
    parsed one by one would cost the test client more than the node."""
    heads: list[bytes] = []
    rest = b""
    while len(heads) < count:
        chunk = await asyncio.wait_for(reader.read(1 << 20), silence)
        assert chunk, f"connection closed after {len(heads)} of {count} answers"
        *complete, rest = (rest + chunk).split(b"\r\n\r\n")
        heads.extend(complete)
    assert not rest, "more than the answers asked for"
    return heads


async def closed_by_node(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the node still sends before it closes the connection."""
    return await asyncio.wait_for(reader.read(), timeout)


# -- bare LF ------------------------------------------------------------------------

BARE_LF = [
    f"GET {PATH} HTTP/1.1\nHost: {HOST}\n\n".encode(),
    f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\n".encode(),
    f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\n\r\n".encode(),
]


@pytest.mark.parametrize("fast_hits", [True, False])
@pytest.mark.parametrize("raw", BARE_LF, ids=["all-lf", "crlf-then-lf", "lf-then-crlf"])
async def test_a_head_with_bare_line_feeds_is_answered_400_at_once(origin, make_node, session, fast_hits, raw):
    # "At once" by cause: with the head timeout an hour (such heads used to be held that long), an answer
    # within the guard is one that did not wait for it.
    node = await warm(origin, make_node, session, fast_hits=fast_hits, request_head_timeout=3600)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(raw)
    answer = await closed_by_node(reader, GUARD)
    writer.close()
    assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]


async def test_a_flood_of_bare_lf_heads_leaves_other_clients_served(origin, make_node, session):
    node = await warm(origin, make_node, session)
    conns = [await asyncio.open_connection("127.0.0.1", node.server.port) for _ in range(100)]
    for _, writer in conns:
        writer.write(BARE_LF[1])
    await served_meanwhile(node.server.port)
    for reader, writer in conns:
        assert re.match(rb"HTTP/1\.[01] 400 ", await closed_by_node(reader, 2.0))
        writer.close()


# -- the request-head timeout ---------------------------------------------------------

@pytest.mark.parametrize("fast_hits", [True, False])
async def test_a_trickled_head_is_answered_408_after_the_head_timeout(origin, make_node, session, fast_hits):
    node = await warm(origin, make_node, session, fast_hits=fast_hits, request_head_timeout=0.5)
    started = time.monotonic()  # before the connection opens: the node's timer starts when it does
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    for byte in get()[:20]:  # a byte at a time, never the end of the head
        writer.write(bytes([byte]))
        await asyncio.sleep(0.01)
    await served_meanwhile(node.server.port)
    # Only the head timer answers 408, and the guard is far below the idle timeout; no upper bound on when
    # (at 2.5 s it was a speed claim), and the lower one taken before the connection opened.
    answer = await closed_by_node(reader, GUARD)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]
    assert time.monotonic() - started >= 0.5


@pytest.mark.parametrize("fast_hits", [True, False])
async def test_a_connection_that_never_sends_a_head_is_closed_after_the_head_timeout(
        origin, make_node, session, fast_hits):
    node = await warm(origin, make_node, session, fast_hits=fast_hits, request_head_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    assert await closed_by_node(reader, 3.0) == b""
    writer.close()


async def test_a_second_head_trickled_on_a_connection_aiohttp_serves_is_answered_408(origin, make_node, session):
    node = await warm(origin, make_node, session, request_head_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(get(PATH, "Range: bytes=0-9", "X-Request-Id: 1"))  # a field only the handler takes
    head, body = await read_response(reader)
    assert head.startswith(b"HTTP/1.1 206 ") and body == BODY[:10]
    writer.write(get()[:15])
    answer = await closed_by_node(reader, 3.0)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


@pytest.mark.parametrize("request_extra", [(), ("Range: bytes=0-9", "X-Request-Id: 1")], ids=["fast-hit", "handler"])
async def test_an_idle_keep_alive_connection_outlives_the_head_timeout(origin, make_node, session, request_extra):
    node = await warm(origin, make_node, session, request_head_timeout=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    for _ in range(2):
        writer.write(get(PATH, *request_extra))
        head, _ = await asyncio.wait_for(read_response(reader), 2.0)
        assert re.match(rb"HTTP/1\.1 20[06] ", head)
        await asyncio.sleep(1.0)  # idle between requests is keep-alive's business, not the head timer's
    writer.close()


# -- the connection cap ----------------------------------------------------------------

async def test_at_the_cap_the_connection_waiting_longest_gives_way_to_a_new_client(origin, make_node, session):
    node = await warm(origin, make_node, session, max_connections=8)
    conns = []
    for _ in range(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        writer.write(b"GET /d/")  # a head that never completes
        conns.append((reader, writer))
        await asyncio.sleep(0.005)
    await until(lambda: node.server.gate.reclaimed >= 12)
    await served_meanwhile(node.server.port)
    assert len(node.server.gate.open) <= 8
    # The oldest gave way, the newest are still open.
    assert await closed_by_node(conns[0][0], 1.0) == b""
    assert not conns[-1][0].at_eof()
    for _, writer in conns:
        writer.close()


async def test_when_every_connection_is_answering_a_newcomer_gets_503_with_retry_after(origin, make_node, session):
    origin.put("/d/big.bin", BIG)
    node = await make_node(max_connections=3)
    assert (await node.get(session, "/d/big.bin"))[2] == BIG
    await node.node.settled()
    busy = []
    for _ in range(3):  # each asks for 16 MiB and does not read it yet
        reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
        writer.write(get("/d/big.bin"))
        busy.append((reader, writer))
    await until(lambda: len(node.server.gate.open) == 3 and not any(c.waiting for c in node.server.gate.open))
    [(head, body)] = await exchange(node.server.port, get(), timeout=1.0)
    assert head.startswith(b"HTTP/1.1 503 ") and header_line(head, b"Retry-After") == b"1"
    assert header_line(head, b"Connection") == b"close" and b"connection limit" in body
    assert node.server.gate.refused == 1
    assert b"nezha_connections_refused_total 1.0" in node.node.metrics.render()
    for reader, writer in busy:  # the busy ones were not harmed
        head, body = await asyncio.wait_for(read_response(reader), 10)
        assert body == BIG
        writer.close()
    await until(lambda: len(node.server.gate.open) < 3)
    await served_meanwhile(node.server.port, "/d/big.bin", BIG)


# -- half-closed clients ----------------------------------------------------------------

HALF_CLOSE_CASES = {
    "hit-connection-close": ([get(PATH, "Connection: close")], [BODY]),
    "range-hit": ([get(PATH, "Range: bytes=100-199")], [BODY[100:200]]),
    "pipelined-pair": ([get(), get(PATH, "Range: bytes=0-9")], [BODY, BODY[:10]]),
    "pipelined-hit-pair": ([get(), get()], [BODY, BODY]),
    "head-then-get": ([get(method="HEAD"), get(PATH, "Connection: close")], [b"", BODY]),
}


@pytest.mark.parametrize("fast_hits", [True, False])
@pytest.mark.parametrize("case", list(HALF_CLOSE_CASES))
async def test_a_client_that_half_closes_after_its_requests_gets_every_answer(
        origin, make_node, session, fast_hits, case):
    node = await warm(origin, make_node, session, fast_hits=fast_hits)
    requests, bodies = HALF_CLOSE_CASES[case]
    methods = tuple("HEAD" if r.startswith(b"HEAD") else "GET" for r in requests)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(b"".join(requests))
    writer.write_eof()
    for method, expected in zip(methods, bodies):
        head, body = await asyncio.wait_for(read_response(reader, method=method), 2.0)
        assert re.match(rb"HTTP/1\.1 20[06] ", head) and body == expected
    assert await closed_by_node(reader, 2.0) == b""  # and then the node closes
    writer.close()


async def test_a_half_closed_cold_request_is_answered_from_the_origin(origin, make_node, session):
    origin.put("/d/cold.bin", BODY)
    node = await make_node()
    [(head, body)] = await exchange(node.server.port, get("/d/cold.bin"), half_close=True, timeout=3.0)
    assert header_line(head, b"X-Nezha-Cache") == b"miss" and body == BODY


async def test_a_body_cut_short_by_a_half_close_ends_the_connection_without_reaching_the_origin(
        origin, make_node, session):
    node = await warm(origin, make_node, session)
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(f"PUT /d/upload.bin HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 100\r\n\r\n".encode() + b"x" * 10)
    writer.write_eof()
    answer = await closed_by_node(reader, 2.0)
    writer.close()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert "/d/upload.bin" not in origin.uploads


# -- pipelining backlog -------------------------------------------------------------------

async def test_a_client_that_pipelines_heads_without_reading_holds_a_bounded_backlog(origin, make_node, session):
    node = await warm(origin, make_node, session)
    # The session that warmed the object keeps its connection on the fast path (its miss was led there).
    warming = set(node.server._fast_connections())
    # A small receive buffer, set before connecting: left to autotuning, the
    # client's kernel may take all 20 MB of answers (tcp_rmem allows 32 MiB
    # here), and the node would rightly never need to stop reading.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", node.server.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    flood = get(method="HEAD") * 50_000  # 2.6 MB of requests, about 20 MB of answers
    writer.write(flood)
    # The node stops reading once its answers back up: wait for that moment
    # (a fixed sleep raced the node on a loaded machine), then check what it holds.

    def flooding() -> list:
        return [c for c in node.server._fast_connections() if c not in warming]

    def paused() -> bool:
        conns = flooding()
        return len(conns) == 1 and not conns[0].transport.is_reading()

    await until(paused, timeout=10.0)
    (conn,) = flooding()
    assert conn.transport.get_write_buffer_size() <= 1 << 20  # a high-water mark, not 20 MB of answers
    assert len(conn._buf) <= 1 << 20
    await served_meanwhile(node.server.port)
    for _ in range(50_000):
        head, _ = await asyncio.wait_for(read_response(reader, method="HEAD"), 5.0)
        assert head.startswith(b"HTTP/1.1 200 ")
    writer.close()


# -- a node process: descriptor limits, memory and log lines under floods ------------------

async def test_300_trickling_clients_under_a_256_descriptor_limit_leave_room_for_a_real_client(
        origin, node_process, session):
    origin.put(PATH, BODY)
    node = node_process(origin.url, nofile=(256, 256))
    await node.ready(session)
    [listening] = [e for e in node.events() if e["event"] == "node_listening"]
    assert listening["open_files"] == 256 and listening["max_connections"] < 256
    # Paused while they connect, the node finds every one of them pending at once when it resumes (as after a
    # long pause or on a loaded machine): asyncio then accepts a whole backlog in one go, before the cap sees any.
    node.proc.send_signal(signal.SIGSTOP)
    try:
        async def trickle() -> asyncio.StreamWriter:
            _, writer = await asyncio.open_connection("127.0.0.1", node.port)
            writer.write(b"G")
            return writer
        connecting = [asyncio.ensure_future(trickle()) for _ in range(300)]
        await asyncio.sleep(0.5)
    finally:
        node.proc.send_signal(signal.SIGCONT)
    conns = await asyncio.wait_for(asyncio.gather(*connecting), 30.0)
    await asyncio.sleep(0.5)
    await served_meanwhile(node.port)  # a cold miss: the node still has descriptors for the origin
    await served_meanwhile(node.port)  # and the hit
    for writer in conns:
        writer.close()
    assert "out of system resource" not in node.err.read_text() + node.out.read_text()


async def test_the_node_raises_its_soft_open_files_limit_to_the_hard_one(origin, node_process, session):
    node = node_process(origin.url, nofile=(256, 4096))
    await node.ready(session)
    [listening] = [e for e in node.events() if e["event"] == "node_listening"]
    assert listening["open_files"] == 4096
    assert listening["max_connections"] == default_max_connections(4096)


# The node answers about 250 MB and the test client reads every head: under four busy loops on 2 cores that
# passed pytest's 120 s default once the 1 s bound no longer failed it first. A guard against a hang.
@pytest.mark.timeout(600)
async def test_a_pipelined_flood_of_heads_costs_bounded_memory_and_few_log_lines(origin, node_process, session):
    origin.put(PATH, BODY)
    node = node_process(origin.url, nofile=(4096, 4096))
    await node.ready(session)
    await served_meanwhile(node.port)
    await served_meanwhile(node.port)
    before = node.rss_kib()
    reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
    requests = 33 * 1024 * 1024 // len(get(method="HEAD"))  # the 33 MiB of requests
    flood = get(method="HEAD") * requests  # and about 250 MB of answers
    writer.write(flood)
    await asyncio.sleep(2.0)  # the node answers until the unread answers pause it
    await served_meanwhile(node.port)
    peak = node.rss_kib()
    heads = await read_heads(reader, requests)
    assert len(heads) == requests and all(head.startswith(b"HTTP/1.1 200 ") for head in heads)
    writer.close()
    assert peak - before < 32 * 1024, f"RSS grew {peak - before} KiB"
    lines = node.out.read_text().count("\n")
    assert lines < 1000, f"{lines} log lines for one client's flood"
