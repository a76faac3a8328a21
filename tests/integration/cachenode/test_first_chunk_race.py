"""Chunk 0 of a cold chunked object is fetched from the origin once, even when its first owner is asked for it
before the key's owner's push reaches it (chunks/fills.py `ChunkFills._first_answer_at`).

The key's owner stores chunk 0 from its cold fill's first answer and pushes it to the chunk's first owner
(chunks/adopted.py), but the manifest is stored, and replicated to the key's other owners, before that push:
a reader that learned of the manifest meanwhile had the chunk's first owner fill chunk 0 from the origin as
well, one chunk more at the origin (1.125 S in about one run in ten of the stampede benchmark's
`shipped-chunks`, docs/benchmarks.md, 2026-11-28). Three in-process nodes (R = 2), where the key's first owner
(n1) owns none of chunk 0 and the key's second owner (n2) is chunk 0's first owner; the push is held until the
second read is done.
"""

from __future__ import annotations

import asyncio

from nezha.chunks import Layout, place
from tests.integration.cachenode.test_chunks import BODY, CHUNK, CHUNKED, KEY, SIZE, put, read, settled, sha


async def test_chunk_0s_first_owner_asked_before_the_push_copies_it_from_the_key_owner(origin, cluster, session):
    put(origin)
    nodes, members = await cluster(3, replicas=2, **CHUNKED)
    key_owner, second = members.ring().owners(KEY, 2)
    first_of_chunk_0 = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)[0][0]
    assert (key_owner, first_of_chunk_0) == ("n1", "n2") and second == "n2", "the ring this scene needs"
    peers = nodes[key_owner].node.chunk_copies.adopted.peers
    push, late = peers.push, asyncio.Event()

    async def held(peer, target, spec):  # the key owner's push of chunk 0, held until the second read is done
        if spec.index == 0:
            await late.wait()
        return await push(peer, target, spec)

    peers.push = held
    before = len(origin.request_headers)
    whole = f"bytes=0-{CHUNK - 1}"
    try:
        # The cold fill through the key's owner; its manifest is answered once the push has waited its second.
        status, _, digest, n = await read(nodes[key_owner], session)
        assert (status, n, digest) == (200, SIZE, sha(BODY))
        # A reader through chunk 0's first owner, which holds the manifest's replica and no flight of chunk 0.
        status, _, digest, n = await read(nodes[first_of_chunk_0], session, headers={"Range": whole})
        assert (status, n, digest) == (206, CHUNK, sha(BODY[:CHUNK]))
    finally:
        late.set()
    await settled(nodes)
    ranges = [h.get("Range") for h in origin.request_headers[before:] if h.get("Range")]
    assert ranges.count(whole) == 1, f"chunk 0 was asked of the origin {ranges.count(whole)} times: {ranges}"
    assert nodes[first_of_chunk_0].node.store.lookup(f"{KEY}#chunk/{CHUNK}/0") is not None, \
        "chunk 0's first owner holds it, copied from the key's owner"
