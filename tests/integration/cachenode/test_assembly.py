"""Objects assembled from signed ranged parts (cachenode/fill/assembly.py),
against a real store in a temp directory: the parts of one version become
one stored object, `authorize`; anything else gives its room back."""

from __future__ import annotations

import asyncio
import os

import pytest

from cachenode.counts import Counts
from cachenode.fill.assembly import Assemblies
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from nezha.config import Origin
from nezha.keys import Target

KEY = "http://data.example/datasets/shard-0.bin"
TARGET = Target("http", "data.example", "/datasets/shard-0.bin", "")
ORIGIN = Origin(host="data.example", upstream="http://127.0.0.1:9", credentials="authorize")
ETAG = '"v1"'
BODY = os.urandom(300_000)


def answer(first: int, end: int, *, etag: str = ETAG, total: int = len(BODY), **extra: str) -> dict[str, str]:
    return {"Content-Range": f"bytes {first}-{end - 1}/{total}", "ETag": etag,
            "Cache-Control": "private, max-age=60", "Content-Type": "application/octet-stream",
            "x-amz-checksum-crc32": "AAAAAA==", **extra}


@pytest.fixture
async def world(tmp_path):
    store = Store(tmp_path / "data", capacity=10 * len(BODY))
    await store.open()
    copied = []
    counts = Counts(metrics=Metrics(), index=None, from_peer=lambda _: False)
    parts = Assemblies(store=store, counts=counts, replicate=lambda meta, target: copied.append(meta.key))
    return store, parts, copied


async def send(parts: Assemblies, first: int, end: int, *, body: bytes = BODY, chunk: int = 65536,
               **fields: str):
    """One caller's part, streamed through the writer as respond.passthrough would."""
    writer = await parts.keep(206, answer(first, end, total=len(body), **fields), {}, key=KEY, url=f"{KEY}?x=1",
                              target=TARGET, origin=ORIGIN)
    if writer is None:
        return None
    for at in range(first, end, chunk):
        await writer.write(body[at:min(end, at + chunk)])
    return await writer.close()


async def test_parts_arriving_together_and_out_of_order_become_one_stored_authorize_object(world):
    store, parts, copied = world
    cuts = [(200_000, 300_000), (0, 100_000), (100_000, 200_000)]
    results = await asyncio.gather(*(send(parts, a, b) for a, b in cuts))
    stored = [m for m in results if m is not None]
    assert len(stored) == 1 and len(parts) == 0
    meta = store.lookup(KEY)
    assert meta is stored[0] and meta.authorize and meta.size == len(BODY) and meta.etag == ETAG
    assert open(store.data_path(meta), "rb").read() == BODY
    names = {n.lower() for n, _ in meta.headers}
    # A part's range and whole-object digests describe the part, not the object.
    assert "content-range" not in names and "x-amz-checksum-crc32" not in names and "content-type" in names
    assert copied == [KEY]  # its replicas get their copy as after a fill
    assert store.used_bytes == len(BODY)


async def test_a_part_of_another_version_starts_the_object_anew_and_frees_the_old_parts(world):
    store, parts, _ = world
    assert await send(parts, 0, 100_000) is None
    reserved = store._usage.reserved
    other = os.urandom(len(BODY))
    await send(parts, 0, 150_000, body=other, etag='"v2"')
    assert await send(parts, 150_000, len(BODY), body=other, etag='"v2"') is not None
    assert open(store.data_path(store.lookup(KEY)), "rb").read() == other
    assert reserved == len(BODY) and store._usage.reserved == 0


async def test_a_part_carrying_more_bytes_than_its_content_range_is_not_kept(world):
    store, parts, _ = world
    writer = await parts.keep(206, answer(0, 10), {}, key=KEY, url=KEY, target=TARGET, origin=ORIGIN)
    await writer.write(BODY[:64])
    await writer.close()
    await send(parts, 10, len(BODY))
    assert store.lookup(KEY) is None  # bytes 0-9 were never held


async def test_an_object_invalidated_while_a_part_streams_is_never_stored_and_its_room_comes_back(world):
    store, parts, _ = world
    writer = await parts.keep(206, answer(0, len(BODY)), {}, key=KEY, url=KEY, target=TARGET, origin=ORIGIN)
    await writer.write(BODY[:1000])
    await parts.forget(KEY, why="a PUT succeeded")
    await writer.write(BODY[1000:])
    assert await writer.close() is None
    assert store.lookup(KEY) is None and store._usage.reserved == 0
    assert not list(store.tmp.iterdir())


async def test_idle_assemblies_give_way_at_the_limit_and_busy_ones_refuse_new_objects(tmp_path):
    store = Store(tmp_path / "data")
    await store.open()
    counts = Counts(metrics=Metrics(), index=None, from_peer=lambda _: False)
    parts = Assemblies(store=store, counts=counts, replicate=lambda *_: None, limit=2)
    busy = await parts.keep(206, answer(0, 10), {}, key=KEY + "a", url=KEY, target=TARGET, origin=ORIGIN)
    assert await send_to(parts, KEY + "b") is not None  # idle once its writer closed
    assert await send_to(parts, KEY + "c") is not None  # "b" gave way
    assert len(parts) == 2
    assert await parts.keep(206, answer(0, 10), {}, key=KEY + "d", url=KEY, target=TARGET, origin=ORIGIN) is not None
    assert await parts.keep(206, answer(0, 10), {}, key=KEY + "e", url=KEY, target=TARGET, origin=ORIGIN) is None
    await busy.close()


async def send_to(parts: Assemblies, key: str):
    writer = await parts.keep(206, answer(0, 10), {}, key=key, url=key, target=TARGET, origin=ORIGIN)
    if writer is not None:
        await writer.write(BODY[:10])
        await writer.close()
    return writer


async def test_an_object_larger_than_the_capacity_is_never_assembled(tmp_path):
    store = Store(tmp_path / "data", capacity=1000)
    await store.open()
    counts = Counts(metrics=Metrics(), index=None, from_peer=lambda _: False)
    parts = Assemblies(store=store, counts=counts, replicate=lambda *_: None)
    assert await parts.keep(206, answer(0, 10), {}, key=KEY, url=KEY, target=TARGET, origin=ORIGIN) is None


async def test_an_assembled_object_leaves_no_descriptor_of_its_temp_file_open(world):
    """Each assembly's temp file is written by parts and read by nobody before its
    commit: once stored (or dropped), none of its descriptors stays open for the
    life of the process."""
    store, parts, _ = world
    temps = []
    new_temp = store.new_temp

    async def recorded(**kw):
        temp = await new_temp(**kw)
        temps.append(temp)
        return temp

    store.new_temp = recorded
    for a, b in [(0, 150_000), (150_000, 300_000)]:
        await send(parts, a, b)
    assert store.lookup(KEY) is not None
    assert len(temps) == 1 and temps[0].read_fd == -1 and temps[0].fd == -1
