"""A chunk copy that breaks off mid-chunk goes on from the byte it reached, and is still checked whole
(chunks/landing.py): the copy of a stored chunk carries its sender's block checksums, and the chunk its fill
commits, written by the sender and then by the origin, must give them. A mix that does not (an origin that
changed its bytes under the same ETag) is refused, and the chunk is fetched once more, whole.

In-process nodes on 127.0.0.1 sharing one ring (R = 2), the object of test_chunks.py: a 64 MiB object in
4 MiB chunks. The chunk's first owner holds it and sends half of any answer, then drops the connection.
"""

from __future__ import annotations

import asyncio
from unittest import mock

import aiohttp
import pytest
from structlog.testing import capture_logs

from cachenode.chunks.landing import unread
from cachenode.chunks.reads import origin_url
from cachenode.chunks.spec import manifest_validator
from cachenode.fill.pace import WINDOW
from cachenode.fill.running import FILL_READ
from nezha.chunks import Layout, chunk_key, place
from nezha.keys import target_of
from tests.integration.cachenode.test_chunks import (BODY, CHUNK, CHUNKED, KEY, PATH, SIZE, MiB, body_of,
                                                     half_then_hang_up, put, read, settled, sha)


async def a_chunk_whose_first_owner_sends_half(origin, cluster, session):
    """Four nodes, every chunk on both its owners; then one chunk (past the first) removed from its
    second owner, whose first owner sends half of its answers for it and hangs up. The nodes, the
    chunk's index, its first and second owner, and its block checksums there."""
    put(origin)
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    await read(nodes["n0"], session)
    await settled(nodes)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)
    index, (first, behind) = next((i, owners) for i, owners in enumerate(table) if i > 0 and len(owners) == 2)
    ckey = chunk_key(KEY, index, CHUNK)
    blocks = nodes[first].node.store.lookup(ckey).blocks
    assert await nodes[behind].node.store.remove_one(nodes[behind].node.store.lookup(ckey))
    nodes[first].node.chunk_owner.send_file = half_then_hang_up
    return nodes, index, first, behind, blocks


async def a_chunk_with_an_owner_behind(origin, cluster, session):
    """Four in-process nodes (R = 2) holding the object's manifest and chunk 0, and a later chunk with two
    owners, still cold: (nodes, its index, its first owner, the owner behind it that copies it)."""
    put(origin)
    nodes, members = await cluster(4, replicas=2, **CHUNKED)
    assert (await read(nodes["n0"], session, headers={"Range": f"bytes=0-{CHUNK - 1}"}))[0] == 206
    await settled(nodes)
    table = place(members.ring(), KEY, Layout(size=SIZE, chunk_size=CHUNK), 2)
    index, (first, behind) = next((i, owners) for i, owners in enumerate(table) if i > 0 and len(owners) == 2)
    return nodes, index, first, behind


def copy_held_at(node, at: int) -> tuple[asyncio.Event, asyncio.Event]:
    """`node`'s sends of a chunk to the owner copying it, held at byte `at` of the chunk until `go` is set:
    (frozen, set once a send reached `at`; go)."""
    frozen, go = asyncio.Event(), asyncio.Event()
    send_file = node.node.chunk_owner.send_file

    async def held(request, resp, f, offset, count):
        if offset + count > at and not go.is_set():
            if offset < at:
                await send_file(request, resp, f, offset, at - offset)
                count, offset = count - (at - offset), at
            frozen.set()
            await go.wait()
        await send_file(request, resp, f, offset, count)

    node.node.chunk_owner.send_file = held
    return frozen, go


async def test_a_copy_broken_off_mid_chunk_goes_on_from_the_origin_and_gives_its_senders_checksums(
        origin, cluster, session):
    """A client reads the chunk through its second owner, whose fill copies it from the first owner (a whole
    copy, with the sender's block checksums): cut at half, the fill asks the origin for the rest only, the
    client's bytes are exact, and the chunk committed is the one the sender holds, block for block."""
    nodes, index, first, behind, blocks = await a_chunk_whose_first_owner_sends_half(origin, cluster, session)
    a, b = index * CHUNK, (index + 1) * CHUNK - 1
    before = len(origin.request_headers)
    status, _, digest, n = await read(nodes[behind], session, headers={"Range": f"bytes={a}-{b}"})
    assert (status, n, digest) == (206, CHUNK, sha(BODY[a:b + 1]))
    await settled(nodes)
    ranges = [h.get("Range") for h in origin.request_headers[before:]]
    assert ranges == [f"bytes={a + CHUNK // 2}-{b}"], f"the origin was asked for {ranges}"
    stored = nodes[behind].node.store.lookup(chunk_key(KEY, index, CHUNK))
    assert stored is not None and stored.blocks == blocks


async def test_a_copy_finished_by_an_origin_whose_bytes_changed_under_the_same_etag_is_refused_and_fetched_whole(
        origin, cluster, session):
    """The origin's bytes change but its ETag does not (it breaks its validator's promise): the first
    owner's half and the origin's rest do not give the sender's block checksums, so that file is refused
    (never stored torn), and the chunk is fetched once more, whole, from the origin: what is stored is one
    version's bytes, all of them."""
    nodes, index, first, behind, _ = await a_chunk_whose_first_owner_sends_half(origin, cluster, session)
    a, b = index * CHUNK, (index + 1) * CHUNK - 1
    other = body_of(SIZE, b"other")
    origin.files[PATH] = other  # the same ETag (origin.etags), other bytes
    holder = next(nid for nid, nd in nodes.items() if KEY in nd.node.store)
    target = target_of(KEY)
    before = len(origin.request_headers)
    with capture_logs() as logs:
        stored = await nodes[behind].node.chunk_owner.fills.local(
            key=KEY, url=origin_url(nodes[behind].node.settings, target), target=target,
            layout=Layout(size=SIZE, chunk_size=CHUNK), index=index,
            validator=manifest_validator(nodes[holder].node.store.lookup(KEY)))
    assert [e["key"] for e in logs if e["event"] == "corrupt_copy"] == [chunk_key(KEY, index, CHUNK)]
    ranges = [h.get("Range") for h in origin.request_headers[before:]]
    assert ranges == [f"bytes={a + CHUNK // 2}-{b}", f"bytes={a}-{b}"], f"the origin was asked for {ranges}"
    with open(nodes[behind].node.store.data_path(stored), "rb") as f:
        assert sha(f.read()) == sha(other[a:b + 1])


async def test_the_bytes_aiohttp_held_when_a_body_broke_off_are_taken_from_its_buffer():
    """Once a body's reader holds an exception its reads raise it, and the bytes it had received are
    dropped; `unread` takes them from its buffer, from where the last read stopped (aiohttp's private
    fields: this fails if a new aiohttp moves them)."""
    reader = aiohttp.StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    reader.feed_data(b"abc")
    reader.feed_data(b"defg")
    assert await reader.readexactly(2) == b"ab"
    reader.set_exception(aiohttp.ClientPayloadError("cut"))
    with pytest.raises(aiohttp.ClientPayloadError):
        await reader.read(10)
    assert unread(reader) == b"cdefg"


async def test_a_first_owners_origin_fill_keeps_within_a_window_of_the_owner_copying_it(origin, cluster, session):
    """A chunk's first owner fills it from the origin while its second owner copies it as it grows: when
    that copy stops at byte P (its sends held there), the fill stops reading the origin a window past P
    (fill/pace.py WINDOW, give or take one read), where it ran to the chunk's end before, so a first owner
    killed then takes with it only the bytes within that window that the copy lacks. Released, the copy
    goes on, and the client reading through the second owner gets the chunk's exact bytes, the origin
    asked for it once."""
    nodes, index, first, behind = await a_chunk_with_an_owner_behind(origin, cluster, session)
    at = MiB
    frozen, go = copy_held_at(nodes[first], at)
    fills = nodes[first].node.chunk_owner.fills
    a, b = index * CHUNK, (index + 1) * CHUNK - 1
    before = len(origin.request_headers)
    with mock.patch("cachenode.fill.pace.STALL", 3600.0):  # the held copy is waited for, however long the test takes
        reading = asyncio.ensure_future(read(nodes[behind], session, headers={"Range": f"bytes={a}-{b}"}))
        try:
            await asyncio.wait_for(frozen.wait(), 30)
            growing = next(f.growing for f in fills._fills.values() if f.growing is not None)
            while growing.temp.written < at + WINDOW:  # the window past P is filled at once ...
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # ... and nothing past it while the copy is held
            assert growing.temp.written <= at + WINDOW + FILL_READ < CHUNK, \
                f"the fill read {growing.temp.written} bytes while the copy was held at {at}"
        finally:
            go.set()
        status, _, digest, n = await reading
    assert (status, n, digest) == (206, CHUNK, sha(BODY[a:b + 1]))
    assert [h.get("Range") for h in origin.request_headers[before:]] == [f"bytes={a}-{b}"]
