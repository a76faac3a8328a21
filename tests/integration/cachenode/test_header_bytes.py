"""Issue 14: origin header bytes outside Latin-1 reach clients exactly as sent, on every path.

A UTF-8 `Content-Disposition` filename and a raw 0xFF in `Content-Type` used
to be altered on the handler path (aiohttp's serializer drops what it cannot
encode) and to break every fast-path hit of the object. Each path that can
answer for a stored or storing object is asked here on a raw socket, and the
field bytes are compared with what the origin wrote.
"""

from __future__ import annotations

import pytest

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST, exchange, header_line, owner_and_other

TYPE = b"application/x-\xffdata"
DISPOSITION = 'attachment; filename="€.bin"'.encode("utf-8")
BODY = b"d" * 5000


def get(path: str, *extra: str, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}", *extra, "", ""]
    return "\r\n".join(lines).encode()


@pytest.fixture
async def odd_origin(raw_origin):
    return await raw_origin(BODY, framing="length", content_type=TYPE,
                            extra_head=(b"Content-Disposition: " + DISPOSITION,))


def assert_exact(head: bytes) -> None:
    assert header_line(head, b"Content-Type") == TYPE
    assert header_line(head, b"Content-Disposition") == DISPOSITION


@pytest.mark.parametrize("fast_hits", [True, False])
async def test_the_miss_and_every_later_hit_carry_the_origins_bytes(odd_origin, make_node, fast_hits):
    node = await make_node(origins=[Origin(host=HOST, upstream=odd_origin.url)], fast_hits=fast_hits)
    [(head, body)] = await exchange(node.server.port, get("/odd.bin"))
    assert b" 200 " in head.split(b"\r\n")[0] and header_line(head, b"X-Nezha-Cache") == b"miss"
    assert_exact(head) and body == BODY
    await node.node.settled()
    for _ in range(2):
        [(head, body)] = await exchange(node.server.port, get("/odd.bin"))
        assert header_line(head, b"X-Nezha-Cache") == b"hit" and body == BODY
        assert_exact(head)
    [(head, body)] = await exchange(node.server.port, get("/odd.bin", method="HEAD"), methods=("HEAD",))
    assert_exact(head) and body == b""
    assert odd_origin.requests == 1


async def test_a_range_hit_and_a_revalidation_answer_carry_them_too(odd_origin, make_node):
    node = await make_node(origins=[Origin(host=HOST, upstream=odd_origin.url)])
    await exchange(node.server.port, get("/odd.bin"))
    await node.node.settled()
    [(head, body)] = await exchange(node.server.port, get("/odd.bin", "Range: bytes=10-19"))
    assert head.startswith(b"HTTP/1.1 206 ") and body == BODY[10:20]
    assert_exact(head)
    [(head, body)] = await exchange(node.server.port, get("/odd.bin", 'If-None-Match: "raw"'))
    assert head.startswith(b"HTTP/1.1 304 ") and body == b""
    # A 304 leaves out Content-Type and Content-Disposition (RFC 9110 §15.4.5).
    assert header_line(head, b"Content-Type") is None


async def test_a_relayed_response_carries_the_owners_bytes(odd_origin, cluster):
    nodes, _ = await cluster(2, origins=[Origin(host=HOST, upstream=odd_origin.url)])
    owners, others = owner_and_other(nodes, "/odd.bin")
    [(head, body)] = await exchange(nodes[others[0]].server.port, get("/odd.bin"))
    assert header_line(head, b"X-Nezha-Served-By") == owners[0].encode() and body == BODY
    assert_exact(head)
    await nodes[owners[0]].node.settled()
    [(head, body)] = await exchange(nodes[others[0]].server.port, get("/odd.bin"))
    assert header_line(head, b"X-Nezha-Cache") == b"peer-hit" and body == BODY
    assert_exact(head)
