"""Large objects chunked across the ring (issue 27, part 2): an object at least `chunk_threshold` long is
stored as `chunk_size` chunks, each on the owner of its own key and filled from the origin by that owner with
one Range + If-Range request; any node answers a whole or ranged read in order from the chunks' owners.

In-process nodes on 127.0.0.1, each on its own port and disk, sharing one ring (the `cluster` fixture), R = 1.
Sizes are kept modest (a 64 MiB object in 4 MiB chunks: 16 of them) so the suite stays quick on a loaded box.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections import Counter

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from nezha.chunks import Layout, chunk_key, chunk_of, place
from nezha.config import Origin
from nezha.ring import Membership
from nezha.wire import CUT_HEADER
from structlog.testing import capture_logs

from tests.integration.cachenode.conftest import HOST, key_of, owner_and_other

MiB = 1 << 20
PATH = "/datasets/coco/train2017.zip"
KEY = key_of(PATH)
SIZE = 64 * MiB
CHUNK = 4 * MiB
CHUNKED = {"chunk_threshold": 32 * MiB, "chunk_size": CHUNK}


def body_of(size: int, seed: bytes = b"") -> bytes:
    """Bytes no two offsets of which repeat within a chunk, so any misplaced piece shows."""
    block = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(MiB // 32))
    return b"".join(bytes([n % 256]) + block[1:] for n in range(size // MiB)) + block[:size % MiB]


BODY = body_of(SIZE)


def put(origin, body: bytes = BODY, **kwargs) -> None:
    origin.put(PATH, body, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"}, **kwargs)


async def settled(nodes) -> None:
    """Until every node's fills have committed: a reader may have had a chunk's last byte before its owner
    committed it."""
    for nd in nodes.values():
        await nd.node.settled()


def chunk_bytes(nodes) -> dict[str, int]:
    """Bytes of chunks of KEY each node stores."""
    held = Counter()
    for nid, nd in nodes.items():
        for meta in nd.node.store.metas():
            found = chunk_of(meta.key)
            if found is not None and found[0] == KEY:
                held[nid] += meta.size
    return dict(held)


def chunk_files(nodes) -> dict[str, list[str]]:
    """Per node, the keys of KEY's chunks whose meta is on its disk (what a restart would load)."""
    held = {}
    for nid, nd in nodes.items():
        keys = [json.loads(p.read_text())["key"] for p in (nd.node.store.root / "objects").rglob("*.meta")]
        held[nid] = sorted(k for k in keys if (chunk_of(k) or ("",))[0] == KEY)
    return held


async def read(node, session, headers=None) -> tuple[int, CIMultiDict, str, int]:
    """GET PATH through `node`: status, headers, SHA-256 of the body, its length (streamed, never held)."""
    digest, n = hashlib.sha256(), 0
    async with session.get(node.url + PATH, headers={"Host": HOST, **(headers or {})}) as r:
        async for data in r.content.iter_chunked(1 << 20):
            digest.update(data)
            n += len(data)
        return r.status, r.headers.copy(), digest.hexdigest(), n


async def half_then_hang_up(request, resp, f, offset, count):
    """A chunk owner's `send_file` that sends the first half of the chunk and drops the connection,
    as a node killed mid-chunk does."""
    if offset + count <= CHUNK // 2:
        await resp.write(os.pread(f.fileno(), count, offset))
        return
    await resp.write(os.pread(f.fileno(), CHUNK // 2 - offset, offset))
    request.transport.close()
    raise ConnectionResetError("killed mid-chunk")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_large_object_is_chunked_over_four_nodes_with_one_origin_fetch_per_chunk(origin, cluster, session):
    put(origin)
    nodes, _ = await cluster(4, **CHUNKED)
    first = next(iter(nodes.values()))
    status, headers, digest, n = await read(first, session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    assert headers["X-Nezha-Cache"] in ("miss", "peer-miss")
    layout = Layout(size=SIZE, chunk_size=CHUNK)
    spans = sorted(f"bytes={a}-{b}" for a, b in map(layout.span, range(layout.count)))
    ranges = [h.get("Range") for h in origin.request_headers]
    assert ranges[:2] == [f"bytes=0-{CHUNK - 1}", None], \
        "the first answer is chunk 0, which shows the size; then a HEAD for the whole object's fields"
    assert sorted(ranges[:1] + ranges[2:]) == spans, "one ranged fetch per chunk, each once"
    assert all(h.get("If-Range") == origin.etags[PATH] for h in origin.request_headers[2:])
    await settled(nodes)
    held = chunk_bytes(nodes)
    assert sum(held.values()) == SIZE and len(held) == 4
    assert max(held.values()) <= 0.4 * SIZE, f"one node holds more than 40% of the object: {held}"
    # The manifest's owner stores no byte of the object itself.
    manifests = [nd.node.store.lookup(KEY) for nd in nodes.values() if KEY in nd.node.store]
    assert len(manifests) == 1 and manifests[0].size == 0 and manifests[0].length == SIZE
    # A whole read through every node is exact and in order, with no new origin fetch.
    for nid, node in nodes.items():
        status, headers, digest, n = await read(node, session)
        assert (status, n, digest) == (200, SIZE, sha(BODY))
        assert int(headers["Content-Length"]) == SIZE and headers["ETag"] == origin.etags[PATH]
        assert headers["X-Nezha-Cache"] == ("hit" if KEY in node.node.store else "peer-hit"), nid
    assert origin.requests[PATH] == 1 + layout.count


@pytest.mark.parametrize("asked", [(SIZE // 2 - 100, SIZE // 2 + 100), (5 * CHUNK, 6 * CHUNK - 1),
                                   (SIZE - 10, SIZE - 1)])
async def test_a_range_fetches_only_the_chunks_it_needs(origin, cluster, session, asked):
    put(origin)
    nodes, _ = await cluster(4, **CHUNKED)
    a, b = asked
    for node in nodes.values():  # the first read fills, the others find the chunks stored
        status, headers, digest, n = await read(node, session, headers={"Range": f"bytes={a}-{b}"})
        assert (status, n, digest) == (206, b - a + 1, sha(BODY[a:b + 1]))
        assert headers["Content-Range"] == f"bytes {a}-{b}/{SIZE}"
    needed = {a // CHUNK, b // CHUNK}
    ranges = [h.get("Range") for h in origin.request_headers]
    assert ranges[0] is None
    fetched = sorted(int(re.match(r"bytes=(\d+)-", r).group(1)) // CHUNK for r in ranges[1:])
    assert fetched == sorted(needed), f"fetched chunks {fetched} for bytes {a}-{b}"


async def test_a_chunked_object_larger_than_any_node_capacity_is_cached_and_served(origin, cluster, session):
    put(origin)
    # Each node holds less than the 64 MiB object: room for its own chunks (5 at most on this ring) and the
    # 7 a read through it has in flight at once (chunks/reads.py WINDOW + 1, passes reserving their room).
    capacity = 48 * MiB
    nodes, _ = await cluster(4, capacity=capacity, **CHUNKED)
    for node in nodes.values():
        status, _, digest, n = await read(node, session)
        assert (status, n, digest) == (200, SIZE, sha(BODY))
    assert origin.requests[PATH] == 1 + SIZE // CHUNK, "every chunk was kept: no chunk was fetched twice"
    await settled(nodes)
    assert all(nd.node.store.used_bytes <= capacity for nd in nodes.values())
    assert sum(chunk_bytes(nodes).values()) == SIZE


async def test_a_node_alone_stores_a_large_object_whole(origin, make_node, session):
    """With no other node to spread chunks over, chunking gains nothing: the object is stored whole."""
    put(origin)
    node = await make_node(**CHUNKED)
    status, _, digest, n = await read(node, session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    await node.node.settled()
    assert node.node.store.lookup(KEY).size == SIZE and not node.node.store.lookup(KEY).chunk_size


async def test_chunking_off_stores_the_object_whole(origin, cluster, session):
    put(origin)
    nodes, _ = await cluster(2, chunk_threshold=0, chunk_size=CHUNK)
    status, _, digest, n = await read(next(iter(nodes.values())), session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    for nd in nodes.values():
        await nd.node.settled()
    assert chunk_bytes(nodes) == {}
    assert any(nd.node.store.lookup(KEY) is not None and nd.node.store.lookup(KEY).size == SIZE
               for nd in nodes.values())


async def test_an_object_changed_at_the_origin_between_chunks_is_never_served_mixed(origin, cluster, session):
    """Chunk 0 is stored; the origin then replaces the object. A read that needs chunk 0 and chunk 1 finds
    chunk 1 of another version (its ETag): the client's body breaks rather than end in the new bytes, no chunk
    of the new version is stored under the old manifest, the old version's chunks are removed from every
    node, and the next read is the new object, whole."""
    put(origin)
    nodes, _ = await cluster(4, **CHUNKED)
    reader = next(iter(nodes.values()))
    status, _, digest, _ = await read(reader, session, headers={"Range": f"bytes=0-{CHUNK - 1}"})
    assert (status, digest) == (206, sha(BODY[:CHUNK]))
    new = body_of(SIZE, seed=b"v2")
    put(origin, new)
    with pytest.raises(aiohttp.ClientPayloadError):
        await read(reader, session)
    for nd in nodes.values():
        await nd.node.settled()
        for meta in nd.node.store.metas():
            found = chunk_of(meta.key)
            assert found is None or meta.etag != origin.etags[PATH], "a chunk of the new version was stored"
    assert chunk_files(nodes) == {nid: [] for nid in nodes}, "the old version's chunks were removed everywhere"
    status, headers, digest, n = await read(reader, session)
    assert (status, n, digest) == (200, SIZE, sha(new))
    assert headers["ETag"] == origin.etags[PATH]


async def test_concurrent_cold_reads_through_every_node_fetch_each_chunk_once(origin, cluster, session):
    put(origin)
    nodes, _ = await cluster(4, **CHUNKED)
    results = await asyncio.gather(*(read(node, session) for node in nodes.values() for _ in range(2)))
    assert {(status, n, digest) for status, _, digest, n in results} == {(200, SIZE, sha(BODY))}
    assert origin.requests[PATH] == 1 + SIZE // CHUNK
    ranges = [h["Range"] for h in origin.request_headers if "Range" in h]  # and one HEAD
    assert len(set(ranges)) == len(ranges) == SIZE // CHUNK


async def test_a_relayed_read_takes_the_manifest_not_the_bytes_from_the_key_owner(origin, cluster, session):
    """The node a client asks reads the chunks from their owners itself: the owner of the object's key sends
    it the manifest (no body), so one object's bytes never funnel through that one node."""
    put(origin)
    nodes, _ = await cluster(4, **CHUNKED)
    (owner,), others = owner_and_other(nodes, PATH)
    await read(nodes[owner], session)  # stored: the manifest on `owner`, the chunks everywhere
    await settled(nodes)
    with capture_logs() as logs:
        status, headers, digest, n = await read(nodes[others[0]], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    assert headers["X-Nezha-Cache"] == "peer-hit"
    answered = [e for e in logs if e.get("event") == "request_completed" and e.get("cache") != "chunk"]
    assert [e["bytes"] for e in answered] == [0, SIZE], "the owner sent the manifest alone, the reader the object"
    served = [e["bytes"] for e in logs if e.get("event") == "request_completed" and e.get("cache") == "chunk"]
    assert sum(served) + sum(
        m.size for m in nodes[others[0]].node.store.metas() if chunk_of(m.key)) == SIZE


async def test_an_owner_that_breaks_off_mid_chunk_is_resumed_from_the_other_owner_or_the_origin(
        origin, cluster, session):
    """R = 2. One node sends half of every chunk it is asked for, then drops the connection (as a node killed
    mid-read does): the reader goes on from that byte with the chunk's other owner, or the origin, and the
    client's body is exact and whole."""
    put(origin)
    nodes, _ = await cluster(4, replicas=2, **CHUNKED)
    reader, victim = nodes["n0"], nodes["n1"]
    await read(nodes["n2"], session)  # every chunk stored on both its owners
    await settled(nodes)
    fetched = origin.requests[PATH]
    broken = []

    async def half_of_any_answer_then_hang_up(request, resp, f, offset, count):
        await resp.write(os.pread(f.fileno(), count // 2, offset))
        broken.append(count)
        request.transport.close()
        raise ConnectionResetError("killed mid-chunk")

    victim.node.chunk_owner.send_file = half_of_any_answer_then_hang_up
    with capture_logs() as logs:
        status, _, digest, n = await read(reader, session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    assert broken, "the victim was asked for a chunk and broke off"
    resumed = [e for e in logs if e.get("event") == "chunk_source_broke"]
    assert resumed and all(e["resume"] for e in resumed)
    assert origin.requests[PATH] == fetched, "the rest of each piece came from the chunk's other owner"


@pytest.fixture
async def ranged_origin(aiohttp_server):
    """An origin of BODY that answers ranges as a stream, in 256 KiB pieces.
    Once, it cuts the answer for the range starting at `state["cut"]`
    halfway through. For the range starting at `state["hold"]` it sends the
    first half, sets `state["holding"]` and sends the rest only once
    `state["release"]` is set."""
    state = {"cut": None, "hold": None, "holding": asyncio.Event(), "release": asyncio.Event(), "ranges": []}

    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {"ETag": '"v1"', "Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"}
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers.get("Range", ""))
        if m is None:
            return web.Response(body=BODY, headers=headers)
        a, b = int(m.group(1)), int(m.group(2))
        state["ranges"].append(a)
        resp = web.StreamResponse(status=206, headers={**headers, "Content-Range": f"bytes {a}-{b}/{SIZE}"})
        resp.content_length = b - a + 1
        await resp.prepare(request)
        half = a + (b - a + 1) // 2
        cut, held = state["cut"] == a, False
        for at in range(a, b + 1, 256 * 1024):
            if at >= half and cut:
                state["cut"] = None
                await asyncio.sleep(0.05)
                request.transport.close()
                return resp
            if at >= half and state["hold"] == a and not held:
                held = True
                state["holding"].set()
                await state["release"].wait()
            await resp.write(BODY[at:min(at + 256 * 1024, b + 1)])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}", state


async def four_nodes(make_node, tmp_path, url: str, *, chunk: int = CHUNK, **settings) -> tuple[dict, list]:
    """Four in-process nodes n0-n3 of `url` (the ranged origin) chunking KEY in chunks of `chunk`, in
    one ring; with the table of the owners of each of its chunks."""
    nodes = {}
    for i in range(4):
        nodes[f"n{i}"] = await make_node(data_dir=tmp_path / f"n{i}", node_id=f"n{i}",
                                         origins=[Origin(host=HOST, upstream=url)],
                                         **{**CHUNKED, "chunk_size": chunk}, **settings)
    members = Membership(1, {nid: f"127.0.0.1:{nd.server.port}" for nid, nd in nodes.items()})
    for nd in nodes.values():
        nd.node.cluster.update(members)
    return nodes, place(members.ring(), KEY, Layout(size=SIZE, chunk_size=chunk), 1)


@pytest.mark.parametrize("owned_by_reader", [False, True], ids=["peer-owns-it", "reader-owns-it"])
async def test_an_origin_that_breaks_off_mid_chunk_leaves_the_clients_body_whole(ranged_origin, make_node,
                                                                                 tmp_path, session, owned_by_reader):
    """The origin cuts its answer for one chunk halfway. The chunk's fill fails and stores nothing; a peer
    reading that chunk as it grew has its answer cut and takes the rest from the origin itself, as does the
    reading node when it was filling the chunk; the client's body is exact, and the next read fills the chunk."""
    url, state = ranged_origin
    nodes, table = await four_nodes(make_node, tmp_path, url)
    index = next(i for i in range(1, len(table)) if (table[i][0] == "n0") == owned_by_reader)
    state["cut"] = index * CHUNK
    with capture_logs() as logs:
        status, _, digest, n = await read(nodes["n0"], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    assert state["cut"] is None, "the cut happened"
    assert any(e.get("event") in ("chunk_source_broke", "chunk_fill_failed") for e in logs)
    await settled(nodes)
    assert chunk_key(KEY, index, CHUNK) not in nodes[table[index][0]].node.store
    # Counted as any fill is: one failed fill from the origin, on the chunk's owner; every other chunk stored.
    fills = {(nid, outcome): nd.node.metrics.registry.get_sample_value(
        "nezha_fill_duration_seconds_count", {"source": "origin", "outcome": outcome}) or 0
        for nid, nd in nodes.items() for outcome in ("stored", "failed")}
    assert {nid: fills[(nid, "failed")] for nid in nodes} == {nid: int(nid == table[index][0]) for nid in nodes}
    assert sum(fills[(nid, "stored")] for nid in nodes) == len(table) - 1
    assert nodes[table[index][0]].node.metrics.registry.get_sample_value("nezha_fill_failures_total") == 1
    assert sum(nd.node.metrics.registry.get_sample_value("nezha_fills_in_flight") for nd in nodes.values()) == 0
    status, _, digest, n = await read(nodes["n1"], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    await settled(nodes)
    assert chunk_key(KEY, index, CHUNK) in nodes[table[index][0]].node.store


async def test_a_chunked_object_that_must_be_revalidated_is_revalidated_once_and_read_from_its_chunks(
        origin, cluster, session):
    """`Cache-Control: no-cache`: every read asks the origin first; a 304 renews the manifest, and the bytes
    still come from the chunks, not the origin."""
    origin.put(PATH, BODY, headers={"Accept-Ranges": "bytes", "Cache-Control": "no-cache"})
    nodes, _ = await cluster(4, **CHUNKED)
    for node in nodes.values():
        status, headers, digest, n = await read(node, session)
        assert (status, n, digest) == (200, SIZE, sha(BODY))
    conditional = [h for h in origin.request_headers if "If-None-Match" in h]
    assert len(conditional) == 3, "one revalidation per later read, by the key's owner"
    assert origin.requests[PATH] == 1 + SIZE // CHUNK + 3


async def test_head_and_conditionals_on_a_chunked_object_through_a_non_owner(origin, cluster, session):
    put(origin)
    nodes, _ = await cluster(4, **CHUNKED)
    (owner,), others = owner_and_other(nodes, PATH)
    await read(nodes[owner], session)
    node = nodes[others[0]]
    status, headers, body = await node.get(session, PATH, method="HEAD")
    assert (status, int(headers["Content-Length"]), body) == (200, SIZE, b"")
    status, headers, body = await node.get(session, PATH, headers={"If-None-Match": origin.etags[PATH]})
    assert (status, body) == (304, b"")
    a = SIZE - CHUNK - 7
    status, headers, body = await node.get(session, PATH, headers={"Range": f"bytes={a}-",
                                                                   "If-Range": origin.etags[PATH]})
    assert (status, body) == (206, BODY[a:])
    status, headers, body = await node.get(session, PATH, headers={"Range": "bytes=0-9", "If-Range": '"other"'})
    assert (status, len(body)) == (200, SIZE), "If-Range of another version: the whole object"
    assert origin.requests[PATH] == 1 + SIZE // CHUNK


async def test_only_a_peer_with_the_cluster_token_can_ask_for_a_chunk(origin, cluster, session):
    """X-Nezha-Chunk from a client is ignored, also by the node that relays its request to the key's owner
    (the client gets the bytes it asked of the object; no chunk of its naming is fetched); a peer's request
    that names no valid chunk is refused with 400 saying why."""
    put(origin)
    nodes, _ = await cluster(4, cluster_token="s3cret", **CHUNKED)
    node = next(iter(nodes.values()))
    spec = '{"index": 3, "chunk_size": 4194304, "length": 67108864, "etag": "\\"x\\""}'
    status, headers, body = await node.get(session, PATH, headers={"X-Nezha-Chunk": spec, "X-Nezha-Peer": "n9",
                                                                   "Range": "bytes=0-9"})
    assert (status, body) == (206, BODY[:10])
    assert all(h.get("If-Range") != '"x"' for h in origin.request_headers)
    peer = {"X-Nezha-Peer": "n9", "X-Nezha-Token": "s3cret"}
    bad = '{"index": 99, "chunk_size": 4194304, "length": 67108864, "etag": "\\"x\\""}'
    status, _, body = await node.get(session, PATH, headers={"X-Nezha-Chunk": bad, **peer})
    assert status == 400 and b"chunk 99 of an object of 16 chunks" in body
    status, _, body = await node.get(session, PATH, headers={"X-Nezha-Chunk": "{}", **peer})
    assert status == 400 and b"is not a chunk request" in body


async def test_with_two_owners_each_chunk_is_held_by_both_and_fetched_from_the_origin_once(origin, cluster, session):
    """R = 2: the first owner fills a chunk from the origin and has the second copy it from there, so each
    chunk is on both its owners (the index names both) after one origin fetch."""
    put(origin)
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    status, _, digest, n = await read(nodes["n0"], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    await settled(nodes)
    layout = Layout(size=SIZE, chunk_size=CHUNK)
    table = place(members.ring(), KEY, layout, 2)
    holders = [sorted(nid for nid, nd in nodes.items() if chunk_key(KEY, i, CHUNK) in nd.node.store)
               for i in range(layout.count)]
    assert holders == [sorted(owners) for owners in table]
    assert origin.requests[PATH] == 1 + layout.count
    manifests = [nd.node.store.lookup(KEY) for nd in nodes.values() if KEY in nd.node.store]
    assert len(manifests) == 2 and all(m.chunk_size == CHUNK and m.size == 0 for m in manifests), \
        "the key's replica copied the manifest, never the bytes"
    assert max(chunk_bytes(nodes).values()) <= 0.4 * 2 * SIZE


async def test_chunk_and_manifest_writes_leave_no_descriptor_open(origin, cluster, session):
    """Every temp file a chunked fill makes (the manifest's, each chunk's, and each chunk the reading node
    passes on from its owner) has its reading descriptor closed once through: none is left open per chunk
    for the life of the process."""
    put(origin)
    nodes, members = await cluster(4, **CHUNKED)
    passed = sum(owners != ["n0"] for owners in place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 1))
    temps = []
    for nd in nodes.values():
        def recording(new_temp=nd.node.store.new_temp):
            async def new_temp_recorded(**kw):
                temp = await new_temp(**kw)
                temps.append(temp)
                return temp
            return new_temp_recorded
        nd.node.store.new_temp = recording()
    status, _, digest, n = await read(nodes["n0"], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    for nd in nodes.values():
        await nd.node.settled()
    assert len(temps) == 1 + SIZE // CHUNK + passed
    assert all(t.read_fd == -1 and t.fd == -1 for t in temps)


@pytest.mark.parametrize("write", ["PUT", "POST"])
async def test_a_write_to_a_chunked_object_removes_its_chunks_from_every_node_and_the_index(
        origin, cluster, session, redis_server, write):
    """R = 2, a real redis-server. The object's chunks sit on every node and the index names each chunk's two
    holders. A successful write through a node that holds neither the manifest nor every chunk invalidates the
    object: every node removes its chunks (not only the key's owners, which hold the manifest), their files
    go, the index names no holder, and each node's stored bytes are what they were before the object came."""
    put(origin)
    nodes, members = await cluster(4, replicas=2, redis_url=redis_server.url, **CHUNKED)
    before = {nid: nd.node.store.used_bytes for nid, nd in nodes.items()}
    layout = Layout(size=SIZE, chunk_size=CHUNK)
    ckeys = [chunk_key(KEY, i, CHUNK) for i in range(layout.count)]
    owners, others = owner_and_other(nodes, PATH, replicas=2)
    status, _, digest, n = await read(nodes[others[0]], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    await settled(nodes)
    assert sum(len(k) for k in chunk_files(nodes).values()) == 2 * layout.count, "each chunk on both its owners"
    for nd in nodes.values():
        assert await nd.node.index.flush()
    table = place(members.ring(), KEY, layout, 2)
    assert [sorted(await nodes["n0"].node.index.locations(k)) for k in ckeys] == [sorted(o) for o in table]
    with capture_logs() as logs:
        async with session.request(write, nodes[others[1]].url + PATH, data=b"new bytes",
                                   headers={"Host": HOST}) as r:
            assert r.status in (200, 201, 204), await r.text()
    assert chunk_files(nodes) == {nid: [] for nid in nodes}
    assert all(nd.node.store.chunks_of(KEY) == [] and KEY not in nd.node.store for nd in nodes.values())
    assert {nid: nd.node.store.used_bytes for nid, nd in nodes.items()} == before
    dropped = Counter()
    for e in logs:
        if e.get("event") == "chunks_invalidated":
            dropped[e["key"]] += e["chunks"]
    assert dropped == {KEY: 2 * layout.count}
    for nd in nodes.values():
        await nd.node.settled()
        assert await nd.node.index.flush()
    assert [await nodes["n0"].node.index.locations(k) for k in ckeys] == [set()] * layout.count
    assert await nodes["n0"].node.index.locations(KEY) == set()


async def test_a_store_finds_an_objects_chunks_after_a_restart_and_forgets_evicted_ones(tmp_path):
    """`Store.chunks_of`, what invalidation removes, is rebuilt from disk at start-up (chunks stored before a
    restart are removed too) and follows evictions and removals: of every chunk size, never another key's."""
    import time as _time

    from cachenode.store.disk import Store
    from cachenode.store.objects import Meta

    async def stored(store, key, size):
        temp = await store.new_temp()
        await store.write(temp, b"c" * size)
        now = _time.time()
        await store.commit(temp, Meta(key=key, url=KEY, host=HOST, size=0, headers=(("ETag", '"v1"'),),
                                      stored_at=now, expires_at=now + 3600, length=SIZE))

    store = Store(tmp_path / "s", capacity=10_000)
    await store.open()
    small = [chunk_key(KEY, i, 1000) for i in range(3)]
    other = [chunk_key(KEY, 0, 2000), chunk_key(KEY + "x", 0, 1000)]
    for key in small + other:
        await stored(store, key, 1000)
    await store.idle()
    restarted = Store(tmp_path / "s", capacity=10_000)
    await restarted.open()
    assert restarted.chunks_of(KEY) == sorted(small + other[:1])
    assert restarted.chunks_of(KEY + "x") == [other[1]]
    await restarted.remove(small[1])
    for key in other:
        restarted.lookup(key)  # used last: the two left of `small` are evicted first
    restarted.reserve(8_500)  # 1,500 bytes over the capacity and its tenth of headroom: two of 1,000 go
    assert restarted.chunks_of(KEY) == [other[0]]
    await restarted.idle()


async def test_a_reader_gets_its_own_chunk_as_it_fills_not_once_it_is_whole(ranged_origin, make_node, tmp_path,
                                                                           session):
    """The node a client asks is the owner of the chunk it reads first. The origin sends half of that chunk
    and holds the rest until released: the client already has the first half (the node sends its own fill's
    bytes as they land, as it does a peer's), then the whole range, exact, after one origin fetch of the
    chunk, which is stored."""
    url, state = ranged_origin
    # The origin's read timeout outlasts the guard below: a node that waited for the whole chunk would
    # not give up on the held fill and read the chunk from the origin itself meanwhile.
    nodes, table = await four_nodes(make_node, tmp_path, url, origin_read_timeout=600)
    index = next(i for i in range(len(table)) if table[i][0] == "n0")
    a, b = index * CHUNK, (index + 1) * CHUNK - 1
    state["hold"] = a
    digest = hashlib.sha256()
    try:
        async with session.get(nodes["n0"].url + PATH, headers={"Host": HOST, "Range": f"bytes={a}-{b}"}) as r:
            assert r.status == 206
            # A guard against a hang, not a timing assert: waiting for the whole chunk, the node would send
            # no byte of it before the release.
            first = await asyncio.wait_for(r.content.readexactly(CHUNK // 2), timeout=60)
            assert state["holding"].is_set() and not state["release"].is_set()
            digest.update(first)
            state["release"].set()
            async for data in r.content.iter_chunked(MiB):
                digest.update(data)
    finally:
        state["release"].set()  # whatever happened, the held answer ends and the nodes can stop
    assert digest.hexdigest() == sha(BODY[a:b + 1])
    assert state["ranges"] == [a], "one origin fetch, of that chunk"
    await settled(nodes)
    assert chunk_key(KEY, index, CHUNK) in nodes["n0"].node.store


async def test_after_a_scale_up_chunks_are_treated_as_whole_objects_are(origin, make_node, tmp_path, session):
    """Three nodes hold the object's chunks; a fourth joins the ring. As for whole objects (docs/operations.md,
    "Scaling up costs some origin fetches"), each chunk whose owner changed is fetched from the origin again by
    its new owner at its next read, and a copy a node still holds is served by that node to the clients it
    answers, owner or not: a read through a node that lost chunks to the new ring takes those from its own
    disk, and the origin sees only the other moved chunks (and the manifest, if the key's owner moved too)."""
    put(origin)
    nodes = {f"n{i}": await make_node(data_dir=tmp_path / f"n{i}", node_id=f"n{i}", **CHUNKED) for i in range(4)}
    addresses = {nid: f"127.0.0.1:{nd.server.port}" for nid, nd in nodes.items()}
    three = Membership(1, {nid: addresses[nid] for nid in ("n0", "n1", "n2")})
    four = Membership(2, addresses)
    layout = Layout(size=SIZE, chunk_size=CHUNK)
    before, after = place(three.ring(), KEY, layout, 1), place(four.ring(), KEY, layout, 1)
    moved = [i for i in range(layout.count) if before[i] != after[i]]
    reader = max(("n0", "n1", "n2"), key=lambda n: sum(before[i] == [n] for i in moved))
    kept = [i for i in moved if before[i] == [reader]]
    assert moved and kept, f"this key's chunks moved {moved}; none away from {reader}"
    for nd in nodes.values():
        nd.node.cluster.update(three)
    status, _, digest, n = await read(nodes[reader], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    await settled(nodes)
    fetched = origin.requests[PATH]
    for nd in nodes.values():
        nd.node.cluster.update(four)
    status, _, digest, n = await read(nodes[reader], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    # The manifest's new owner asks for the first chunk's range and HEADs the object; that answer is chunk 0,
    # which the chunk's owner copies from there when it moved away from the reader. A reader that owned the
    # key before holds the manifest still, and reads by it: the manifest is not fetched again.
    manifest_moved = three.ring().owners(KEY, 1) != four.ring().owners(KEY, 1)
    manifest_fetched = manifest_moved and three.ring().owners(KEY, 1) != [reader]
    chunk0_with_manifest = manifest_fetched and 0 in moved and 0 not in kept
    assert origin.requests[PATH] - fetched == len(moved) - len(kept) + 2 * manifest_fetched - chunk0_with_manifest
    await settled(nodes)
    for i in moved:  # the reader still holds (and served) its old ones; the others are on their new owners
        assert chunk_key(KEY, i, CHUNK) in nodes[reader if i in kept else after[i][0]].node.store


async def test_a_chunk_filling_when_its_object_is_invalidated_is_removed_once_committed(
        ranged_origin, make_node, tmp_path, session):
    """The object is invalidated while the reading node fills one of its chunks (the origin holding the
    chunk half-way). The fill is let finish, so its reader's body is whole and exact, but the chunk it
    commits is removed: after it, no node holds any chunk of the object."""
    url, state = ranged_origin
    nodes, table = await four_nodes(make_node, tmp_path, url)
    index = next(i for i in range(len(table)) if table[i][0] == "n0")
    a, b = index * CHUNK, (index + 1) * CHUNK - 1
    state["hold"] = a
    digest = hashlib.sha256()
    try:
        with capture_logs() as logs:
            async with session.get(nodes["n0"].url + PATH,
                                   headers={"Host": HOST, "Range": f"bytes={a}-{b}"}) as r:
                assert r.status == 206
                await state["holding"].wait()
                await nodes["n1"].node.handler.invalidate([KEY], why="a test's write")
                state["release"].set()
                async for data in r.content.iter_chunked(MiB):
                    digest.update(data)
            await settled(nodes)
    finally:
        state["release"].set()
    assert digest.hexdigest() == sha(BODY[a:b + 1])
    assert [e["key"] for e in logs if e.get("event") == "chunk_dropped"] == [chunk_key(KEY, index, CHUNK)]
    assert chunk_files(nodes) == {nid: [] for nid in nodes}
    assert all(nd.node.store.chunks_of(KEY) == [] for nd in nodes.values())


@pytest.mark.parametrize("new_size", [SIZE - 4 * CHUNK, 16 * MiB], ids=["chunked-again-shorter", "now-whole"])
async def test_a_new_version_replacing_a_chunked_object_removes_the_old_versions_chunks(
        origin, cluster, session, new_size):
    """`Cache-Control: no-cache`: each read revalidates at the key's owner. The origin replaces the object
    (four chunks shorter and chunked again, or now below the threshold and stored whole): the owner stores
    the new answer and the old version's chunks are removed from every node (those the new version's
    chunks do not replace by key too), while the new version's, filled by the same read, stay."""
    origin.put(PATH, BODY, headers={"Accept-Ranges": "bytes", "Cache-Control": "no-cache"})
    nodes, _ = await cluster(4, **CHUNKED)
    reader = nodes["n0"]
    status, _, digest, n = await read(reader, session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    await settled(nodes)
    old_etag = origin.etags[PATH]
    assert sum(len(k) for k in chunk_files(nodes).values()) == SIZE // CHUNK
    new = body_of(new_size, seed=b"v2")
    origin.put(PATH, new, headers={"Accept-Ranges": "bytes", "Cache-Control": "no-cache"})
    with capture_logs() as logs:
        status, headers, digest, n = await read(reader, session)
        assert (status, n, digest) == (200, new_size, sha(new))
        await settled(nodes)
    removed = sum(e["chunks"] for e in logs if e.get("event") == "old_chunks_removed")
    assert removed >= SIZE // CHUNK - new_size // CHUNK * (new_size >= CHUNKED["chunk_threshold"])
    left = [meta for nd in nodes.values() for meta in nd.node.store.metas()
            if (chunk_of(meta.key) or ("",))[0] == KEY]
    assert all(meta.etag == origin.etags[PATH] != old_etag for meta in left), "an old version's chunk is left"
    assert len(left) == (new_size // CHUNK if new_size >= CHUNKED["chunk_threshold"] else 0)
    assert chunk_files(nodes) == {nid: sorted(m.key for m in left if m.key in nd.node.store)
                                  for nid, nd in nodes.items()}


@pytest.mark.parametrize("chunks, says", [
    ({"chunk_size": 0, "etag": '"v1"'}, b"chunks.chunk_size must be a positive integer, not 0"),
    ({"chunk_size": CHUNK}, b"chunks names no version"),
    ("all", b"chunks must be an object, not str"),
])
async def test_a_request_to_drop_old_chunks_that_names_no_version_is_refused_and_removes_nothing(
        origin, cluster, session, chunks, says):
    put(origin)
    nodes, _ = await cluster(2, **CHUNKED)
    node = nodes["n0"]
    assert (await read(node, session))[0] == 200
    await settled(nodes)
    held = chunk_files(nodes)
    async with session.post(node.url + "/_nezha/invalidate", json={"keys": [KEY], "chunks": chunks}) as r:
        assert r.status == 400 and says in await r.read()
    assert chunk_files(nodes) == held and any(held.values())


async def test_chunks_read_from_the_origin_past_an_owner_that_fails_them_count_as_bytes_from_origin(
        origin, cluster, session):
    """R = 1. An owner answers 503 for every chunk asked of it: the reading node takes those chunks from the
    origin itself, not stored, and counts each of their bytes as bytes from origin (nezha_bytes_from_origin_total,
    `bytes_from_origin` in the index), as it counts any byte an origin sent it."""
    put(origin)
    nodes, members = await cluster(4, **CHUNKED)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 1)
    (key_owner,), others = owner_and_other(nodes, PATH)
    reader = others[0]
    victim = next(n for n in others[1:] if any(owners == [n] for owners in table))
    await read(nodes[key_owner], session)  # every chunk stored on its owner
    await settled(nodes)
    fetched = origin.requests[PATH]

    async def failing(request, record, **_):
        raise web.HTTPServiceUnavailable(text="this owner fails its chunks\n")

    nodes[victim].node.chunk_owner.serve = failing
    metrics = nodes[reader].node.metrics.registry
    before = metrics.get_sample_value("nezha_bytes_from_origin_total")
    status, _, digest, n = await read(nodes[reader], session)
    assert (status, n, digest) == (200, SIZE, sha(BODY))
    failed = [i for i, owners in enumerate(table) if owners == [victim]]
    assert origin.requests[PATH] == fetched + len(failed), "each of the victim's chunks once from the origin"
    assert metrics.get_sample_value("nezha_bytes_from_origin_total") - before == len(failed) * CHUNK
    assert all(chunk_key(KEY, i, CHUNK) not in nodes[reader].node.store for i in failed), "nothing stored"


async def count_chunk_asks(nodes, reader: str) -> Counter:
    """(owner, chunk index) -> how many chunk GETs `reader` made of that owner, from now on."""
    asked: Counter = Counter()
    for nid, nd in nodes.items():
        def counting(serve=nd.node.chunk_owner.serve, nid=nid):
            async def serve_counted(request, record, **kw):
                if request.headers.get("X-Nezha-Peer") == reader and request.method == "GET":
                    asked[(nid, json.loads(request.headers["X-Nezha-Chunk"])["index"])] += 1
                return await serve(request, record, **kw)
            return serve_counted
        nd.node.chunk_owner.serve = counting()
    return asked


async def test_readers_on_one_non_owner_share_one_request_per_chunk_to_its_owner(origin, cluster, session):
    """Six clients read the object at once through one node that owns none of the chunks they read: each
    owner is asked for each of its chunks once by that node, not once per client (the stampede's chunks
    grew with N because they were), every client gets exact bytes, and the passing node stores no chunk."""
    put(origin)
    nodes, members = await cluster(4, **CHUNKED)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 1)
    (key_owner,), others = owner_and_other(nodes, PATH)
    await read(nodes[key_owner], session)  # every chunk stored on its owner: the wave below reads warm owners
    await settled(nodes)
    reader = others[0]
    asked = await count_chunk_asks(nodes, reader)
    results = await asyncio.gather(*(read(nodes[reader], session) for _ in range(6)))
    assert {(status, n, digest) for status, _, digest, n in results} == {(200, SIZE, sha(BODY))}
    theirs = [i for i, owners in enumerate(table) if owners != [reader]]
    assert len(asked) == len(theirs), f"the reader asked for {sorted(asked)}, its owners' chunks are {theirs}"
    assert set(asked.values()) == {1}, f"a chunk asked of its owner more than once: {asked}"
    await settled(nodes)
    assert all(chunk_key(KEY, i, CHUNK) not in nodes[reader].node.store for i in theirs), "nothing stored"


async def test_in_a_cold_wave_a_node_asks_each_chunk_it_does_not_own_first_once_however_many_read_it(
        origin, cluster, session):
    """R = 2, cold. Six clients read the object at once through one node: the chunks it owns behind another
    node are copied once by its fill (kept), those it does not own are passed on once (not kept), each
    asked of the chunk's first owner by one GET from that node (and at most one more of the node that
    owner sent it on to, a node reading the chunk then: chunks/feeders.py); the origin sends each chunk once."""
    put(origin)
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)
    reader = "n0"
    asked = await count_chunk_asks(nodes, reader)
    results = await asyncio.gather(*(read(nodes[reader], session) for _ in range(6)))
    assert {(status, n, digest) for status, _, digest, n in results} == {(200, SIZE, sha(BODY))}
    assert origin.requests[PATH] == 1 + SIZE // CHUNK
    behind = {i: owners[0] for i, owners in enumerate(table) if owners[0] != reader}
    firsts = Counter({(node, i): n for (node, i), n in asked.items() if behind.get(i) == node})
    assert firsts == Counter({(owner, i): 1 for i, owner in behind.items()}), f"asked {asked}"
    sent_on = Counter(i for (node, i), n in asked.items() if behind.get(i) != node for _ in range(n))
    assert set(sent_on) <= set(behind) and set(sent_on.values()) <= {1}, f"asked {asked}"
    await settled(nodes)
    for i, owners in enumerate(table):
        assert (chunk_key(KEY, i, CHUNK) in nodes[reader].node.store) == (reader in owners), i



async def test_readers_of_a_replicas_fill_whose_source_breaks_off_go_on_with_its_fill_not_the_origin(
        origin, cluster, session):
    """R = 2, cold. A chunk's first owner sends half of it, then drops the connection (a node killed
    mid-fill), while six clients of the chunk's second owner follow that node's fill copying it: the fill
    goes on from the origin from the byte it reached and the clients go on with it. The origin is asked for
    the chunk once (the first owner's fill) and for its missing half once (the second owner's), never for
    the chunk again nor for the rest of it once per client."""
    put(origin)
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)
    index, (victim, reader) = next((i, owners) for i, owners in enumerate(table) if len(owners) == 2)
    a, b = index * CHUNK, (index + 1) * CHUNK - 1

    nodes[victim].node.chunk_owner.send_file = half_then_hang_up
    results = await asyncio.gather(*(read(nodes[reader], session, headers={"Range": f"bytes={a}-{b}"})
                                     for _ in range(6)))
    assert {(status, n, digest) for status, _, digest, n in results} == {(206, CHUNK, sha(BODY[a:b + 1]))}
    ranges = [h["Range"] for h in origin.request_headers[1:]]
    assert ranges == [f"bytes={a}-{b}", f"bytes={a + CHUNK // 2}-{b}"], f"origin asked for {ranges}"


async def test_readers_that_reach_a_broken_off_chunk_after_its_fill_ended_read_the_stored_chunk_not_the_origin(
        origin, cluster, session):
    """R = 2, cold, as above, but the six clients of the chunk's second owner come to the chunk only once
    that node's fill of it has gone on from the origin and ended (their window opened the first source's
    file, which broke off at half; a busy link had kept them writing earlier bytes): each goes on from the
    chunk its node now holds. The origin is asked for the chunk once and for its missing half once, never
    for the rest of it once per client (the stampede benchmark's `killed-chunks`, four rests of one chunk
    at the origin)."""
    put(origin)
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)
    index, (victim, reader) = next((i, owners) for i, owners in enumerate(table) if len(owners) == 2)
    a, b = index * CHUNK, (index + 1) * CHUNK - 1

    nodes[victim].node.chunk_owner.send_file = half_then_hang_up
    reads = nodes[reader].node.respond.chunk_body
    fills = nodes[reader].node.chunk_owner.fills
    write = reads._write
    layout = Layout(size=SIZE, chunk_size=CHUNK)

    async def after_the_fill(request, resp, opened, **kwargs):
        while fills.running(KEY, index, layout):  # the chunk's fill here has not ended yet
            await asyncio.sleep(0.01)
        return await write(request, resp, opened, **kwargs)

    reads._write = after_the_fill
    results = await asyncio.gather(*(read(nodes[reader], session, headers={"Range": f"bytes={a}-{b}"})
                                     for _ in range(6)))
    assert {(status, n, digest) for status, _, digest, n in results} == {(206, CHUNK, sha(BODY[a:b + 1]))}
    ranges = [h["Range"] for h in origin.request_headers[1:]]
    assert ranges == [f"bytes={a}-{b}", f"bytes={a + CHUNK // 2}-{b}"], f"origin asked for {ranges}"


async def asked_by_every_node_at_once(ranged_origin, make_node, tmp_path, session, *, chunk: int):
    """A client on each of four nodes reads the object (in chunks of `chunk`) at once, cold, while the
    origin holds one chunk's answer halfway until all three other nodes have asked that chunk's owner for
    it. Every client's bytes are checked exact and the origin's sending the chunk once. Returns the owner
    and every answer to a GET of that chunk: (answering node, asker, role, status)."""
    url, state = ranged_origin
    nodes, table = await four_nodes(make_node, tmp_path, url, chunk=chunk, origin_read_timeout=600)
    index = next(i for i in range(1, len(table)) if table[i][0] != "n0")
    owner = table[index][0]
    state["hold"] = index * chunk
    answered: list[tuple[str, str, str | None, int]] = []  # (server, asker, role, status) for chunk `index`
    for nid, nd in nodes.items():
        def recording(serve=nd.node.chunk_owner.serve, nid=nid):
            async def serve_recorded(request, record, **kw):
                spec = json.loads(request.headers["X-Nezha-Chunk"])
                resp = await serve(request, record, **kw)
                if spec["index"] == index and request.method == "GET":
                    answered.append((nid, request.headers["X-Nezha-Peer"], spec.get("role"), resp.status))
                return resp
            return serve_recorded
        nd.node.chunk_owner.serve = recording()
    reads = [asyncio.ensure_future(read(nd, session)) for nd in nodes.values()]
    try:
        await asyncio.wait_for(state["holding"].wait(), timeout=60)
        others, wave = {nid for nid in nodes if nid != owner}, nodes[owner].node.chunk_owner.feeders
        deadline = asyncio.get_running_loop().time() + 30
        while set(wave.running(chunk_key(KEY, index, chunk))) != others:  # every other node has asked the owner
            assert asyncio.get_running_loop().time() < deadline, f"not every node asked for chunk {index}"
            await asyncio.sleep(0.02)
    finally:
        state["release"].set()
    results = await asyncio.gather(*reads)
    assert {(status, n, digest) for status, _, digest, n in results} == {(200, SIZE, sha(BODY))}
    assert state["ranges"].count(index * chunk) == 1, "the origin sent the chunk once"
    return owner, answered


async def test_nodes_asking_for_a_chunk_while_its_owner_sends_it_read_it_from_each_other_in_a_chain(
        ranged_origin, make_node, tmp_path, session):
    """An object of three chunks on four nodes: the leads cannot be even (one node leads none), so the owner
    sends the chunk to the first node asking and sends each later one on to the node that asked before it (a
    chain, chunks/feeders.py), so its link carries the chunk once, not three times."""
    owner, answered = await asked_by_every_node_at_once(ranged_origin, make_node, tmp_path, session,
                                                        chunk=22 * MiB)
    from_owner = [asker for server, asker, role, status in answered if server == owner and status in (200, 206)]
    fed = [(server, asker) for server, asker, role, status in answered if role == "fed" and status in (200, 206)]
    assert len(from_owner) == 1, f"the owner sent the chunk to {from_owner}: {answered}"
    assert len(fed) == 2 and all(server != owner for server, _ in fed), f"{answered}"
    (first,), chain = from_owner, {asker: server for server, asker in fed}
    second = next((asker for asker, server in chain.items() if server == first), None)
    third = next((asker for asker in chain if asker != second), None)
    assert chain == {second: first, third: second}, f"not a chain from {first}: {chain}"


async def test_where_every_node_leads_its_even_share_of_the_chunks_an_owner_sends_each_asker_a_chunk_itself(
        ranged_origin, make_node, tmp_path, session):
    """Sixteen chunks on four nodes, four led by each: every node asking the owner for a chunk while it
    sends it is answered by the owner (a star, chunks/feeders.py `star`), none sent on to another node."""
    owner, answered = await asked_by_every_node_at_once(ranged_origin, make_node, tmp_path, session, chunk=CHUNK)
    from_owner = {asker for server, asker, role, status in answered if server == owner and status in (200, 206)}
    assert from_owner == {f"n{i}" for i in range(4)} - {owner}, f"{answered}"
    assert [status for *_, status in answered if status not in (200, 206)] == [], f"none sent on: {answered}"
    assert all(role != "fed" for _, _, role, _ in answered), f"{answered}"


async def test_an_owner_behind_cut_by_the_first_owners_failed_source_follows_that_fill_not_the_origin(
        origin, cluster, session):
    """R = 2. A chunk's first owner copies it from a node handing it over (its `source`), which sends half and
    breaks off; the first owner goes on from the origin in the same flight, from the byte it reached. Its second
    owner, copying the chunk from that fill meanwhile, follows that fill as it goes on, so the origin is asked
    once, for the missing half: not for the whole chunk, and not once by each owner (the stampede's
    `killed-chunks`: the key's owner, killed while holding the only copy of chunk 0, cost 1.25 S)."""
    from cachenode.chunks.reads import origin_url
    from cachenode.chunks.spec import manifest_validator
    from nezha.keys import target_of
    from nezha.ring import Peer

    put(origin)
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    await read(next(iter(nodes.values())), session)  # the manifest and every chunk on its owners
    await settled(nodes)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)
    index, (first, behind) = next((i, owners) for i, owners in enumerate(table) if i > 0 and len(owners) == 2)
    source = next(nid for nid in nodes if nid not in (first, behind))
    ckey, a, b = chunk_key(KEY, index, CHUNK), index * CHUNK, (index + 1) * CHUNK - 1
    for nid in (first, behind):
        assert await nodes[nid].node.store.remove_one(nodes[nid].node.store.lookup(ckey))
    asked_by_behind = asyncio.Event()

    def watching(serve=nodes[first].node.chunk_owner.serve):
        async def serve_watched(request, record, **kw):
            if request.headers.get("X-Nezha-Peer") == behind and request.method == "GET":
                asked_by_behind.set()
            return await serve(request, record, **kw)
        return serve_watched

    def half_then_gone(serve=nodes[source].node.chunk_owner.serve):
        async def serve_half(request, record, **kw):
            if CUT_HEADER in request.headers or request.method != "GET":
                return await serve(request, record, **kw)
            resp = web.StreamResponse(status=206, headers={"Content-Range": f"bytes 0-{CHUNK - 1}/{CHUNK}"})
            resp.content_length = CHUNK
            await resp.prepare(request)
            await resp.write(BODY[a:a + CHUNK // 2])
            await asyncio.wait_for(asked_by_behind.wait(), 30)
            await asyncio.sleep(0.2)  # the owner behind reads the first half from the first owner's fill
            request.transport.close()
            return resp
        return serve_half

    nodes[first].node.chunk_owner.serve = watching()
    nodes[source].node.chunk_owner.serve = half_then_gone()
    holder = next(nid for nid, nd in nodes.items() if KEY in nd.node.store)
    manifest = nodes[holder].node.store.lookup(KEY)
    fills, target = nodes[first].node.chunk_owner.fills, target_of(KEY)
    before = len(origin.request_headers)
    handing = asyncio.ensure_future(fills.local(
        key=KEY, url=origin_url(nodes[first].node.settings, target), target=target,
        layout=Layout(size=SIZE, chunk_size=CHUNK), index=index, validator=manifest_validator(manifest),
        source=Peer(source, members.nodes[source])))
    status, _, digest, n = await read(nodes[behind], session, headers={"Range": f"bytes={a}-{b}"})
    await handing
    assert (status, n, digest) == (206, CHUNK, sha(BODY[a:b + 1]))
    ranges = [h.get("Range") for h in origin.request_headers[before:]]
    assert ranges == [f"bytes={a + CHUNK // 2}-{b}"], f"the origin was asked for {ranges}"
    await settled(nodes)
    assert ckey in nodes[first].node.store and ckey in nodes[behind].node.store
