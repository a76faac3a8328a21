"""Small objects (docs/cache-node.md, "Small objects"): one sealed file each,
written on the event loop without an fsync of its own, made durable by a
group sync, and never served when the seal fails: torn at a crash, or a
byte changed on disk since."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from cachenode.store import small
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.store.sealed import unseal

HOST = "www.cs.toronto.edu"
PATH = "/images/n01440764_10026.JPEG"
BODY = os.urandom(20_000)


def stored_files(store: Store) -> list:
    return sorted(p for p in store.objects.rglob("*") if p.is_file())


async def test_a_small_object_is_one_sealed_file_with_its_body_first_and_no_meta(origin, make_node, session):
    origin.put(PATH, BODY)
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    [only] = stored_files(node.node.store)
    assert only.suffix == ".obj"
    whole = only.read_bytes()
    assert whole[:len(BODY)] == BODY
    size, record = unseal(whole)
    assert size == len(BODY) and record["key"] == f"http://{HOST}{PATH}" and record["data"] == only.name


async def test_a_small_object_is_a_hit_after_a_restart(origin, make_node, session, tmp_path):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=600"})
    node = await make_node(data_dir=tmp_path / "d")
    await node.get(session, PATH)
    await node.node.settled()
    await node.server.close()
    again = await make_node(data_dir=tmp_path / "d")
    status, headers, got = await again.get(session, PATH)
    assert (status, got, headers["X-Nezha-Cache"]) == (200, BODY, "hit")
    assert origin.requests[PATH] == 1


@pytest.mark.parametrize("fast_hits", [True, False])
@pytest.mark.parametrize("where", ["body", "record", "trailer"])
async def test_a_byte_flipped_on_disk_in_a_stored_small_object_is_never_served(origin, make_node, session,
                                                                               fast_hits, where):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=600"})
    node = await make_node(fast_hits=fast_hits)
    await node.get(session, PATH)
    await node.node.settled()
    [path] = stored_files(node.node.store)
    at = {"body": len(BODY) // 2, "record": len(BODY) + 5, "trailer": -3}[where]
    damaged = bytearray(path.read_bytes())
    damaged[at] ^= 0x20
    path.write_bytes(damaged)

    status, headers, got = await node.get(session, PATH)
    assert status == 200 and got == BODY and headers["X-Nezha-Cache"] == "miss"
    assert origin.requests[PATH] == 2  # dropped and fetched again
    await node.node.settled()
    status, headers, got = await node.get(session, PATH)
    assert (got, headers["X-Nezha-Cache"]) == (BODY, "hit")
    assert [p.suffix for p in stored_files(node.node.store)] == [".obj"]


@pytest.mark.parametrize("cut", ["short", "zeros"])
async def test_a_torn_small_file_is_dropped_at_start_up_and_fetched_again(origin, make_node, session, tmp_path, cut):
    """What a power loss before the group sync may leave: a file cut short, or pages never written."""
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=600"})
    node = await make_node(data_dir=tmp_path / "d")
    await node.get(session, PATH)
    await node.node.settled()
    await node.server.close()
    [path] = stored_files(node.node.store)
    whole = path.read_bytes()
    path.write_bytes(whole[:8192] if cut == "short" else whole[:8192] + bytes(len(whole) - 8192))

    again = await make_node(data_dir=tmp_path / "d")
    assert len(again.node.store) == 0 and not path.exists()
    status, headers, got = await again.get(session, PATH)
    assert (status, got, headers["X-Nezha-Cache"]) == (200, BODY, "miss")
    assert origin.requests[PATH] == 2


async def test_a_304_gives_a_small_object_a_new_record_that_a_restart_reads(origin, make_node, session, tmp_path):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=0"})
    node = await make_node(data_dir=tmp_path / "d")
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=600"})  # same ETag: the origin answers 304
    status, headers, got = await node.get(session, PATH)
    assert got == BODY and headers["X-Nezha-Cache"] == "revalidated"
    await node.node.settled()
    await node.server.close()
    [path] = stored_files(node.node.store)
    assert "max-age=600" in str(unseal(path.read_bytes())[1]["headers"])

    again = await make_node(data_dir=tmp_path / "d")
    status, headers, got = await again.get(session, PATH)
    assert (got, headers["X-Nezha-Cache"]) == (BODY, "hit")


async def test_a_replaced_small_object_leaves_one_file(origin, make_node, session):
    origin.put(PATH, b"old" * 1000, headers={"Cache-Control": "max-age=0"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"new!" * 1000, headers={"Cache-Control": "max-age=600"})
    await node.get(session, PATH)
    await node.node.settled()
    [path] = stored_files(node.node.store)
    assert path.read_bytes()[:4000] == b"new!" * 1000


def meta(name: str) -> Meta:
    now = time.time()
    return Meta(key=f"http://{HOST}/{name}", url=f"http://{HOST}/{name}", host=HOST, size=0, headers=(),
                stored_at=now, expires_at=now + 600)


async def test_a_small_write_takes_no_thread_and_no_fsync_and_one_group_sync_covers_a_batch(tmp_path,
                                                                                            monkeypatch):
    store = Store(tmp_path / "s", sync_interval=3600)
    await store.open()
    synced = []
    store.group_sync._sync = synced.append
    loop = asyncio.get_running_loop()
    handed = []
    real = loop.run_in_executor
    monkeypatch.setattr(loop, "run_in_executor", lambda *a: handed.append(a) or real(*a))
    fsyncs = []
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd))
    for n in range(50):
        async with store.writing(reserve=1000) as w:
            await store.write(w.temp, b"x" * 600)
            await store.write(w.temp, b"y" * 400)
            await w.commit(meta(f"o{n}"))
    assert handed == [] and fsyncs == []
    assert store.group_sync.pending == 50 and synced == []
    monkeypatch.undo()
    await store.close()  # a node that stops syncs once more
    assert synced == [store.root] and store.group_sync.pending == 0
    assert len(store) == 50 and len(list(store.objects.rglob("*.obj"))) == 50


async def test_the_group_sync_runs_by_itself_after_its_interval(tmp_path):
    store = Store(tmp_path / "s", sync_interval=0.05)
    await store.open()
    async with store.writing(reserve=10) as w:
        await store.write(w.temp, b"0123456789")
        await w.commit(meta("a"))
    for _ in range(200):
        if store.group_sync.syncs:
            break
        await asyncio.sleep(0.01)
    assert store.group_sync.syncs == 1 and store.group_sync.pending == 0


async def test_an_object_above_the_threshold_keeps_the_large_format(tmp_path):
    store = Store(tmp_path / "s", small_max=1000)
    await store.open()
    async with store.writing(reserve=1001) as w:
        await store.write(w.temp, b"z" * 1001)
        stored = await w.commit(meta("big"))
    assert not small.is_sealed(stored)
    assert sorted(p.suffix for p in store.objects.rglob("*") if p.is_file()) == [".data", ".meta"]
    await store.close()
