"""A peer that goes away while a chunk's owner sends it a chunk is not a server error (chunks/owner.py
`ChunkOwner.serve`): one `chunk_reader_gone` line naming the chunk and the bytes that left, the answer's
status as it went, and no traceback. A killed node's passes did this several times per `killed-chunks`
stampede run, each logged as an unhandled ClientGone and a 500 (docs/benchmarks.md, 2026-11-28).

In-process nodes on 127.0.0.1 sharing one ring (R = 2), the object of test_chunks.py: 64 MiB in 4 MiB chunks.
"""

from __future__ import annotations

import asyncio
import logging

from structlog.testing import capture_logs

from cachenode.chunks.spec import ChunkSpec, manifest_validator
from nezha.chunks import Piece, chunk_key
from nezha.keys import target_of
from nezha.ring import Peer
from tests.integration.cachenode.test_chunk_resume import a_chunk_with_an_owner_behind, copy_held_at
from tests.integration.cachenode.test_chunks import CHUNK, KEY, SIZE, MiB, read, settled


async def test_a_peer_gone_mid_chunk_is_one_line_not_a_500(origin, cluster, session, caplog):
    """The chunk's first owner holds it; a peer asks it for the whole chunk, which it sends up to 1 MiB
    and then holds; the peer closes its connection, and the owner's next send finds it gone."""
    nodes, index, first, behind = await a_chunk_with_an_owner_behind(origin, cluster, session)
    a = index * CHUNK
    assert (await read(nodes[first], session, headers={"Range": f"bytes={a}-{a + CHUNK - 1}"}))[0] == 206
    await settled(nodes)
    ckey = chunk_key(KEY, index, CHUNK)
    assert nodes[first].node.store.lookup(ckey) is not None, "the scene needs the chunk stored on its owner"
    manifest = next(m for nd in nodes.values() if (m := nd.node.store.lookup(KEY)) is not None)
    spec = ChunkSpec(index=index, chunk_size=CHUNK, length=SIZE, validator=manifest_validator(manifest))
    owner = Peer(first, f"127.0.0.1:{nodes[first].server.port}")
    frozen, go = copy_held_at(nodes[first], MiB)
    asker = nodes[behind].node.chunk_owner.fills.peers
    caplog.set_level(logging.ERROR, logger="aiohttp.server")
    with capture_logs() as logs:
        opened = await asker.ask(owner, target_of(KEY), spec, Piece(index=index, offset=0, length=CHUNK))
        assert opened is not None and opened.response is not None, "the owner did not answer the chunk"
        await asyncio.wait_for(frozen.wait(), 30)
        assert await opened.response.content.readexactly(64 * 1024)
        opened.response.close()  # the reader goes away with bytes unread: its socket resets
        await asyncio.sleep(0.2)
        go.set()
        for _ in range(3000):  # until the owner's answer ends: 30 s at most
            if any(e["event"] == "request_completed" and e.get("cache") == "chunk" and e["method"] == "GET"
                   for e in logs):
                break
            await asyncio.sleep(0.01)
    gone = [e for e in logs if e["event"] == "chunk_reader_gone"]
    done = [e for e in logs if e["event"] == "request_completed" and e.get("cache") == "chunk"
            and e["method"] == "GET"]
    assert [e["status"] for e in done] == [206], f"the owner answered {done}"
    assert len(gone) == 1, f"the reader's leaving was logged {len(gone)} times: {[e['event'] for e in logs]}"
    assert (gone[0]["key"], gone[0]["chunk"], gone[0]["asker"]) == (ckey, index, behind)
    assert MiB <= gone[0]["bytes"] < CHUNK and gone[0]["bytes"] == done[0]["bytes"], gone[0]
    assert not [r for r in caplog.records if r.name == "aiohttp.server"], \
        [r.getMessage() for r in caplog.records]
