"""A keep-alive connection a follower handed to the primary at a miss goes back
to the follower once it reads hits again (cachenode/front/giving_back.py).

Before, it stayed with the primary for good: a dataset loader's connections
all crossed at their first miss of the first epoch, and every later epoch's
hits were the primary's alone. Real processes (`nezha cache --workers 2`), raw
keep-alive connections, the worker holding each read from /proc."""

from __future__ import annotations

import asyncio
import os

import aiohttp

from testkit.waits import START_GUARD, wait_for
from tests.integration.cachenode.test_workers import HOST, serving_pid, workers_node  # noqa: F401  (a fixture)

BODIES = {f"/epoch/{i}.jpg": os.urandom(20_000 + i) for i in range(3)}
REREADS = 30  # hits per connection after its miss: well past what the primary answers before giving it back


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> tuple[bytes, bytes]:
    """One GET on a kept-alive connection: its head and its body."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    return head, await asyncio.wait_for(reader.readexactly(length), 30)


async def test_a_connection_handed_over_at_a_miss_goes_back_to_its_follower_for_its_hits(workers_node, origin):
    for path, body in BODIES.items():
        origin.put(path, body, headers={"Cache-Control": "max-age=3600"})
    node = workers_node()
    await node.wait_serving()
    follower = node.pid(1)
    # Connections the kernel gave the follower (SO_REUSEPORT spreads them), one per object.
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, int]] = []
    spare: list[asyncio.StreamWriter] = []
    for _ in range(200):
        if len(conns) == len(BODIES):
            break
        reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
        port = writer.get_extra_info("sockname")[1]
        await wait_for(lambda: serving_pid(node.port, port) is not None, timeout=START_GUARD)
        if serving_pid(node.port, port) == follower:
            conns.append((reader, writer, port))
        else:
            spare.append(writer)
    assert len(conns) == len(BODIES), "the kernel never gave the follower enough connections"
    try:
        for (reader, writer, port), (path, body) in zip(conns, BODIES.items()):
            head, got = await ask(reader, writer, path)
            assert b"X-Nezha-Cache: miss" in head and got == body
            assert serving_pid(node.port, port) == node.pid(0), "a miss hands the connection to the primary"
        for _ in range(REREADS):
            for (reader, writer, _), (path, body) in zip(conns, BODIES.items()):
                head, got = await ask(reader, writer, path)
                assert head.startswith(b"HTTP/1.1 200 ") and got == body
        # Held by the follower again, and its hits were the follower's to answer.
        assert [serving_pid(node.port, port) for _, _, port in conns] == [follower] * len(conns)
        answered = {e["path"] for e in node.events("request_completed")
                    if e.get("worker") == 1 and e.get("fast") and e.get("cache") == "hit"}
        assert set(BODIES) <= answered
        async with aiohttp.ClientSession() as session:
            assert await node.metric(session, "nezha_worker_givebacks_total") >= len(conns)
    finally:
        for _, writer, _ in conns:
            writer.close()
        for writer in spare:
            writer.close()
    assert origin.requests == {path: 1 for path in BODIES}


async def test_a_connection_its_follower_has_no_room_for_stays_with_the_primary_and_is_answered(workers_node, origin):
    """--max-connections 3 per worker: the follower holds three idle connections when the primary would give the
    fourth back, so it sends it straight back (never a 503 for having moved) and keeps its own three."""
    (path, body), = list(BODIES.items())[:1]
    origin.put(path, body, headers={"Cache-Control": "max-age=3600"})
    node = workers_node("--max-connections", "3")
    await node.wait_serving()
    follower = node.pid(1)

    async def on_the_follower() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        """A new connection the kernel gave the follower; those it gave the primary closed one by one, so the
        primary's gate never fills with them."""
        for _ in range(200):
            reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
            port = writer.get_extra_info("sockname")[1]
            await wait_for(lambda: serving_pid(node.port, port) is not None, timeout=START_GUARD)
            if serving_pid(node.port, port) == follower:
                return reader, writer, port
            writer.close()
            await wait_for(lambda: serving_pid(node.port, port) is None, timeout=START_GUARD)
        raise AssertionError("the kernel never gave the follower a connection")

    reader, writer, port = await on_the_follower()
    held = []
    try:
        head, got = await ask(reader, writer, path)
        assert b"X-Nezha-Cache: miss" in head and got == body
        held = [await on_the_follower() for _ in range(3)]  # the follower's gate is full now
        for _ in range(REREADS):
            head, got = await ask(reader, writer, path)
            assert head.startswith(b"HTTP/1.1 200 ") and got == body
        assert serving_pid(node.port, port) == node.pid(0)
        for r, w, p in held:  # none was reclaimed to make room for it
            head, got = await ask(r, w, path)
            assert head.startswith(b"HTTP/1.1 200 ") and got == body
            assert serving_pid(node.port, p) == follower
    finally:
        writer.close()
        for _, w, _ in held:
            w.close()
    assert not node.events("connection_refused") and not node.events("connection_reclaimed")
