"""A cold fill from an origin that chunks objects of modest size asks for the first chunk's range first
(cachenode/fill/chunking.py): a chunked object's first answer is its chunk 0, stored and copied by the
chunk's owners, never closed unread; a smaller object comes whole in that answer, or with the rest fetched
after it in ranges; an origin that ignores Range answers 200 and is filled as before.

In-process nodes on 127.0.0.1 sharing one ring (the `cluster` fixture).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import socket
from collections import Counter

import aiohttp
from structlog.testing import capture_logs

from cachenode.chunks.spec import ChunkSpec
from cachenode.fill.parallel import Validator
from nezha.chunks import Layout, chunk_key, place
from nezha.keys import target_of
from nezha.ring import Peer

from tests.integration.cachenode.conftest import HOST, owner_and_other
from tests.integration.cachenode.test_chunks import CHUNK, CHUNKED, KEY, PATH, SIZE, body_of, read, settled, sha

MiB = 1 << 20


async def metrics_of(node) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(node.url + "/metrics") as r:
        return {line.split()[0]: float(line.split()[1]) for line in (await r.text()).splitlines()
                if line.startswith("nezha_") and len(line.split()) == 2}


def asked_spans(origin) -> list[tuple[int, int]]:
    """(first, last) of every ranged request the origin got, in order."""
    spans = []
    for h in origin.request_headers:
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", h.get("Range", ""))
        if m:
            spans.append((int(m.group(1)), int(m.group(2))))
    return spans


def tiles(spans: list[tuple[int, int]], size: int) -> bool:
    """Whether `spans` cover [0, size) once each, no byte twice."""
    at = 0
    for first, last in sorted(spans):
        if first != at:
            return False
        at = last + 1
    return at == size


async def test_a_chunked_objects_cold_wave_costs_the_origin_no_byte_it_throws_away(origin, cluster, session):
    """R = 2, two clients through each of four nodes at once. The origin is asked for each chunk once, the
    first request being chunk 0's range (no plain GET closed unread once the size showed), and one HEAD
    (the whole object's fields, no body); no node counts a discarded origin byte, the nodes took exactly
    the object's bytes from the origin, and chunk 0 is left on its owners alone."""
    body = body_of(SIZE)
    origin.put(PATH, body, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"})
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    results = await asyncio.gather(*(read(node, session) for node in nodes.values() for _ in range(2)))
    assert {(status, n, digest) for status, _, digest, n in results} == {(200, SIZE, sha(body))}
    spans = asked_spans(origin)
    assert sorted(origin.methods) == ["GET"] * len(spans) + ["HEAD"], "every GET a range, and one HEAD"
    assert spans[0] == (0, CHUNK - 1)
    assert "If-Range" not in origin.request_headers[0], "the first answer pins the version the rest is asked of"
    assert tiles(spans, SIZE), f"each byte asked once: {sorted(spans)}"
    await settled(nodes)
    counted = [await metrics_of(nd) for nd in nodes.values()]
    assert [m.get("nezha_origin_bytes_discarded_total", 0.0) for m in counted] == [0.0] * 4
    assert sum(m["nezha_bytes_from_origin_total"] for m in counted) == SIZE
    owners = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)[0]
    holders = sorted(nid for nid, nd in nodes.items() if chunk_key(KEY, 0, CHUNK) in nd.node.store)
    assert holders == sorted(owners), "chunk 0 on its owners, the first answer's copy gone from any other node"


async def test_an_object_below_the_threshold_comes_in_the_first_chunks_answer_and_ranges_for_the_rest(
        origin, cluster, session):
    """16 MiB (threshold 32 MiB, 4 MiB chunks): the first answer is its first 4 MiB, the rest is asked in
    ranges under If-Range; it is stored whole as the object's 200, and read again as a hit, exactly."""
    body = body_of(16 * MiB)
    origin.put(PATH, body, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, **CHUNKED)
    (owner,), _ = owner_and_other(nodes, PATH)
    status, headers, digest, n = await read(nodes[owner], session)
    assert (status, n, digest) == (200, 16 * MiB, sha(body))
    spans = asked_spans(origin)
    assert spans[0] == (0, CHUNK - 1) and tiles(spans, 16 * MiB), spans
    assert all(h.get("If-Range") == origin.etags[PATH] for h in origin.request_headers[1:])
    await settled(nodes)
    meta = nodes[owner].node.store.lookup(KEY)
    assert meta is not None and meta.chunk_size == 0 and meta.size == 16 * MiB
    assert "content-range" not in {name.lower() for name, _ in meta.headers}
    status, headers, digest, n = await read(nodes[owner], session)
    assert (status, n, digest, headers["X-Nezha-Cache"]) == (200, 16 * MiB, sha(body), "hit")
    assert int(headers["Content-Length"]) == 16 * MiB and "Content-Range" not in headers
    assert origin.requests[PATH] == len(spans)


async def test_an_object_no_longer_than_a_chunk_is_one_request_stored_as_its_200(origin, cluster, session):
    body = body_of(3 * MiB + 5)
    origin.put(PATH, body, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, **CHUNKED)
    (owner,), _ = owner_and_other(nodes, PATH)
    for _ in range(2):
        status, headers, digest, n = await read(nodes[owner], session)
        assert (status, n, digest) == (200, len(body), sha(body))
        assert "Content-Range" not in headers
    assert origin.requests[PATH] == 1 and asked_spans(origin) == [(0, CHUNK - 1)]
    assert headers["X-Nezha-Cache"] == "hit"


async def test_an_origin_that_ignores_range_is_filled_from_its_200_and_stored_whole(origin, cluster, session):
    """An origin that answers the first chunk's range with the whole object (200, no Accept-Ranges): one
    request, the object stored whole on its owner, exact bytes."""
    body = body_of(SIZE)
    origin.put(PATH, body, headers={"Cache-Control": "max-age=3600"}, ranges=False)
    nodes, _ = await cluster(2, **CHUNKED)
    (owner,), (other,) = owner_and_other(nodes, PATH)
    status, _, digest, n = await read(nodes[other], session)
    assert (status, n, digest) == (200, SIZE, sha(body))
    assert origin.requests[PATH] == 1 and origin.request_headers[0].get("Range") == f"bytes=0-{CHUNK - 1}"
    await settled(nodes)
    meta = nodes[owner].node.store.lookup(KEY)
    assert meta is not None and meta.chunk_size == 0 and meta.size == SIZE


async def cut_or_exact(node, session, body: bytes) -> str:
    """GET PATH through `node`, streamed: "exact" (every byte, right), "error" (a status that is no 200, and
    no byte of the object), or "cut" (a 200 whose connection ended early, every byte before it right)."""
    digest, n = hashlib.sha256(), 0
    try:
        async with session.get(node.url + PATH, headers={"Host": HOST}) as r:
            if r.status != 200:
                return "error"
            async for data in r.content.iter_chunked(1 << 20):
                digest.update(data)
                n += len(data)
    except aiohttp.ClientPayloadError:
        pass
    assert digest.hexdigest() == sha(body[:n]), f"a wrong byte within the first {n} through {node.url}"
    return "exact" if n == len(body) else "cut"


async def test_an_origin_dying_mid_chunk_0_marks_no_node_down_and_the_object_is_filled_at_its_next_read(
        origin, cluster, session):
    """R = 3 on four nodes: chunk 0 has owners copying it one behind the other from the key's owner, which
    stores the first answer as chunk 0. The origin drops that answer halfway: every client read through
    every node gets exact bytes, an error or a cut, and no node counts the key's owner (nor any other) as
    down, for it answers: only its fill failed. The next read through every node is exact, and the origin
    was asked for no byte more than three times (the answer that died, an owner's fill of chunk 0 in its
    place, the next read's)."""
    body = body_of(SIZE)
    origin.put(PATH, body, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"},
               range_die_after=CHUNK // 2, range_cuts=1, rate=8 * MiB)
    nodes, _ = await cluster(4, replicas=3, **CHUNKED)
    with capture_logs() as logs:
        results = await asyncio.gather(*(cut_or_exact(node, session, body) for node in nodes.values()))
        await settled(nodes)
    assert set(results) <= {"exact", "error", "cut"}
    assert asked_spans(origin)[0] == (0, CHUNK - 1)
    downs = [(e.get("peer"), e.get("reason")) for e in logs if e["event"] == "peer_marked_down"]
    assert downs == [], f"a node marked a live peer down for the origin's failure: {downs}"
    for nid, nd in nodes.items():
        assert not [p for p in nd.node.cluster.owners(KEY, 4) if nd.node.relay.is_down(p)], nid
    origin.behaviour[PATH].rate = None
    for node in nodes.values():
        assert await cut_or_exact(node, session, body) == "exact"
    await settled(nodes)
    asked = Counter()
    for first, last in asked_spans(origin):
        asked[(first, last)] += 1
    most = max(sum(n for (a, b), n in asked.items() if a <= at <= b) for at in range(0, SIZE, CHUNK))
    assert most <= 3, f"a byte asked of the origin {most} times: {sorted(asked.items())}"


async def test_a_peer_whose_chunk_answer_broke_off_is_marked_down_unless_it_says_its_own_fill_failed(cluster):
    """The question a node asks after a peer's chunk answer broke off (chunks/peers.py `broke_off`): a peer
    that cut it because its fill failed says so and stays up; one that cut nothing, and an address where
    nothing answers (connection refused), are marked down as any peer that breaks off."""
    nodes, _ = await cluster(2)
    asker, peer = nodes["n0"].node, nodes["n1"].node
    me = Peer("n1", f"127.0.0.1:{nodes['n1'].server.port}")
    spec = ChunkSpec(index=0, chunk_size=CHUNK, length=SIZE, validator=Validator(etag='"v1"', last_modified=None))
    peer.chunk_owner.cuts.note(chunk_key(KEY, 0, CHUNK), "its fill ended after 7 of 4194304 bytes")
    with capture_logs() as logs:
        await asker.chunk_owner.fills.peers.broke_off(me, target_of(KEY), spec, "broke off after 7 bytes")
    assert not asker.relay.is_down(me)
    assert [e["reason"] for e in logs if e["event"] == "chunk_peer_fill_failed"] == [
        "its fill ended after 7 of 4194304 bytes"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = Peer("gone", f"127.0.0.1:{s.getsockname()[1]}")  # bound, never listening: refused
        await asker.chunk_owner.fills.peers.broke_off(gone, target_of(KEY), spec, "broke off after 7 bytes")
    assert asker.relay.is_down(gone)
    other = dataclasses.replace(spec, index=1)  # no answer of chunk 1 was cut there
    await asker.chunk_owner.fills.peers.broke_off(me, target_of(KEY), other, "broke off after 7 bytes")
    assert asker.relay.is_down(me)
