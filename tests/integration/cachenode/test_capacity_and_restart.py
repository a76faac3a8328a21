"""Disk bounds and what survives a restart."""

import asyncio
import os

import aiohttp
import pytest


async def test_least_recently_used_objects_are_evicted_under_capacity(origin, make_node, session):
    for name in "abcd":
        origin.put(f"/{name}", name.encode() * 40_000)
    node = await make_node(capacity=100_000)
    for name in "abc":
        await node.get(session, f"/{name}")
        await node.node.settled()
        if name == "b":
            await node.get(session, "/a")  # touch a: b is now the oldest
    store = node.node.store
    assert "http://www.cs.toronto.edu/b" not in store
    assert {"http://www.cs.toronto.edu/a", "http://www.cs.toronto.edu/c"} <= set(store.keys())
    assert store.used_bytes <= 100_000
    on_disk = sum(p.stat().st_size for p in store.objects.rglob("*.data"))
    assert on_disk <= 100_000
    async with session.get(node.url + "/metrics") as r:
        assert "nezha_evictions_total 1.0" in await r.text()


async def test_object_larger_than_capacity_is_streamed_through_unstored(origin, make_node, session):
    origin.put("/big", b"B" * 200_000)
    node = await make_node(capacity=100_000)
    status, headers, got = await node.get(session, "/big")
    assert status == 200 and got == b"B" * 200_000 and headers["X-Nezha-Cache"] == "pass"
    await node.node.settled()
    assert len(node.node.store) == 0


async def test_restart_rebuilds_index_and_deletes_leftover_temporary_files(origin, make_node, session, tmp_path):
    data = tmp_path / "persist"
    origin.put("/keep", b"k" * 5000)
    node = await make_node(data_dir=data, small_object_max=0)  # the large format: .meta + .data
    await node.get(session, "/keep")
    await node.node.settled()
    await node.server.close()
    # What a crash mid-fill and mid-commit leaves behind:
    (data / "tmp" / "deadbeef.part").write_bytes(b"partial")
    sub = data / "objects" / "ab"
    sub.mkdir(exist_ok=True)
    (sub / ("ab" + "0" * 62 + ".123.data")).write_bytes(b"data without meta")
    meta = next(data.rglob("*.meta"))
    data_file = next(p for p in meta.parent.iterdir() if p.suffix == ".data")

    node2 = await make_node(data_dir=data, small_object_max=0)
    assert list((data / "tmp").iterdir()) == []
    assert not (sub / ("ab" + "0" * 62 + ".123.data")).exists()
    status, headers, got = await node2.get(session, "/keep")
    assert got == b"k" * 5000 and headers["X-Nezha-Cache"] == "hit"
    assert origin.requests["/keep"] == 1
    await node2.server.close()

    # A data file cut short (a torn write) is never served: it is dropped and refetched.
    with open(data_file, "r+b") as f:
        f.truncate(100)
    node3 = await make_node(data_dir=data, small_object_max=0)
    assert len(node3.node.store) == 0
    status, headers, got = await node3.get(session, "/keep")
    assert got == b"k" * 5000 and headers["X-Nezha-Cache"] == "miss"
    assert origin.requests["/keep"] == 2
    assert not os.path.exists(data_file)


async def test_a_late_eviction_unlink_never_deletes_the_meta_of_a_recommit(tmp_path, monkeypatch):
    """An eviction's queued unlink of <id>.meta runs before a later commit of the same key, never after it."""
    import threading
    import time
    from pathlib import Path

    from cachenode.store.disk import Store
    from cachenode.store.objects import Meta

    key = "http://www.cs.toronto.edu/k"
    store = Store(tmp_path / "s", capacity=1000, small_max=0)  # the large format: .meta + .data
    await store.open()

    async def commit(body: bytes) -> None:
        temp = await store.new_temp()
        os.close(temp.read_fd)
        await store.write(temp, body)
        now = time.time()
        await store.commit(temp, Meta(key=key, url=key, host="www.cs.toronto.edu", size=0, headers={},
                                      stored_at=now, expires_at=now + 600))

    await commit(b"1" * 600)
    release, unlinked = threading.Event(), threading.Event()
    real_unlink = Path.unlink

    def slow_meta_unlink(self, missing_ok=False):
        if self.suffix == ".meta" and self.parent.parent == store.objects:
            release.wait(5)
            real_unlink(self, missing_ok=missing_ok)
            unlinked.set()
            return
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", slow_meta_unlink)
    store.reserve(600)  # another fill's reservation evicts k; unlinking its meta is held up
    store.release(600)
    assert key not in store
    asyncio.get_running_loop().call_later(0.3, release.set)
    await commit(b"2" * 500)
    assert await asyncio.get_running_loop().run_in_executor(None, unlinked.wait, 5)
    monkeypatch.undo()

    assert len(list(store.objects.rglob("*.meta"))) == 1
    reopened = Store(tmp_path / "s", capacity=1000, small_max=0)
    await reopened.open()
    meta = reopened.lookup(key)
    assert meta is not None and meta.size == 500
    with open(reopened.data_path(meta), "rb") as f:
        assert f.read() == b"2" * 500


async def test_store_idle_waits_for_the_unlink_of_an_evicted_object(origin, make_node, session, monkeypatch):
    """Unlinks run in the background; `idle()` returns only when they are done."""
    import time
    from pathlib import Path

    for name in "ab":
        origin.put(f"/{name}", name.encode() * 60_000)
    node = await make_node(capacity=100_000)
    real_unlink = Path.unlink

    def slow_unlink(self, missing_ok=False):
        if self.suffix in (".data", ".obj"):
            time.sleep(0.2)
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", slow_unlink)
    for name in "ab":
        await node.get(session, f"/{name}")
        await node.node.settled()
    await node.node.store.idle()
    assert [p.read_bytes()[:1] for p in node.node.store.objects.rglob("*") if p.suffix in (".data", ".obj")] == [b"b"]


async def test_chunked_object_larger_than_capacity_is_streamed_whole_but_never_stored(origin, make_node, session):
    """Without Content-Length the bound is checked as bytes arrive: the client
    gets the whole body, the store keeps what it had and evicts nothing."""
    for name in "ab":
        origin.put(f"/{name}", name.encode() * 40_000)
    big = bytes(range(256)) * 1200  # 307,200 bytes
    origin.put("/big", big, chunked=True)
    node = await make_node(capacity=100_000, small_object_max=0)  # data files hold their bodies alone
    for name in "ab":
        await node.get(session, f"/{name}")
        await node.node.settled()
    results = await asyncio.gather(*(node.get(session, "/big") for _ in range(3)))
    for status, headers, got in results:
        assert status == 200 and got == big and "Content-Length" not in headers
    await node.node.settled()
    store = node.node.store
    await store.idle()
    assert set(store.keys()) == {"http://www.cs.toronto.edu/a", "http://www.cs.toronto.edu/b"}
    assert store.used_bytes == 80_000
    assert sum(p.stat().st_size for p in store.objects.rglob("*.data")) == 80_000
    assert list(store.tmp.iterdir()) == []
    async with session.get(node.url + "/metrics") as r:
        text = await r.text()
    assert "nezha_evictions_total 0.0" in text
    assert "nezha_fill_failures_total 0.0" in text  # streamed whole: not a failed fill
    status, headers, got = await node.get(session, "/big")
    assert got == big and headers["X-Nezha-Cache"] == "miss"
    assert origin.requests["/big"] == 2


@pytest.mark.parametrize("fast_hits", [True, False], ids=["fast-path", "aiohttp"])
async def test_a_data_file_deleted_behind_the_nodes_back_is_refetched_not_an_error(origin, make_node, fast_hits):
    """The index still names the object but its bytes are gone: the node forgets it and fetches it again."""
    origin.put("/lost", b"L" * 5000)
    node = await make_node(fast_hits=fast_hits)
    async with aiohttp.ClientSession() as s:
        await node.get(s, "/lost")
    await node.node.settled()
    meta = node.node.store.lookup("http://www.cs.toronto.edu/lost")
    os.unlink(node.node.store.data_path(meta))
    async with aiohttp.ClientSession() as s:  # a new connection, so the fast path sees it first
        status, headers, got = await node.get(s, "/lost")
    assert status == 200 and got == b"L" * 5000 and headers["X-Nezha-Cache"] == "miss"
    assert origin.requests["/lost"] == 2
    await node.node.settled()
    assert node.node.store.lookup("http://www.cs.toronto.edu/lost") is not None
