"""A small object stored at once leaves the node as a hit does: its head and
body in one write to the client's socket, not a write for the head and one
for the body (two system calls and, on a fast client, two packets and two
wake-ups per cold fill; docs/benchmarks.md, "Small objects")."""

from __future__ import annotations

import os
from asyncio import selector_events

from tests.integration.cachenode.conftest import HOST

PATH = "/train/n01440764/n01440764_10027.JPEG"
BODY = os.urandom(16 * 1024)


def record_writes(monkeypatch) -> list[bytes]:
    """Every write to a plain TCP transport in this process (asyncio's
    writelines joins its pieces into one write, so it is counted once)."""
    writes: list[bytes] = []
    real = selector_events._SelectorSocketTransport.write

    def write(self, data) -> None:
        writes.append(bytes(data))
        real(self, data)

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", write)
    return writes


async def test_a_small_cold_miss_stored_at_once_sends_its_head_and_body_in_one_write(origin, make_node, session,
                                                                                     monkeypatch):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    writes = record_writes(monkeypatch)
    async with session.get(node.url + PATH, headers={"Host": HOST}) as r:
        assert (r.status, r.headers["X-Nezha-Cache"], await r.read()) == (200, "miss", BODY)
    [answer] = [w for w in writes if b"X-Nezha-Cache: miss" in w]
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\n" + BODY)


async def test_a_head_request_for_a_small_cold_object_gets_its_head_alone(origin, make_node, session, monkeypatch):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    await node.get(session, PATH)
    writes = record_writes(monkeypatch)
    async with session.head(node.url + PATH, headers={"Host": HOST, "Cache-Control": "no-cache"}) as r:
        assert r.status == 200 and r.headers["Content-Length"] == str(len(BODY))
    assert not any(BODY[:64] in w for w in writes)
