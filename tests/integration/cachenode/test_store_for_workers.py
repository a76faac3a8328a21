"""What the store promises a node's other workers (cachenode/workers/): every
change to its index announced in order, and a removed object's file gone by
the time the removal returns, so a follower a moment behind finds nothing to
serve rather than the old bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cachenode.store.disk import Store
from cachenode.store.objects import Meta

KEY = "http://www.cs.toronto.edu/k"


async def commit(store: Store, key: str, body: bytes) -> Meta:
    temp = await store.new_temp()
    os.close(temp.read_fd)
    await store.write(temp, body)
    now = time.time()
    return await store.commit(temp, Meta(key=key, url=key, host="www.cs.toronto.edu", size=0, headers=[],
                                         stored_at=now, expires_at=now + 600))


async def test_a_follower_replaying_the_announced_changes_holds_the_writers_index(tmp_path):
    writer = Store(tmp_path / "s", capacity=1000)
    await writer.open()
    follower = Store(tmp_path / "s")  # the same folder, never opened: it only mirrors
    writer.watchers.append(follower.mirror)
    first = await commit(writer, KEY, b"1" * 400)
    await commit(writer, KEY + "2", b"2" * 400)
    assert follower.lookup(KEY).data == first.data
    replaced = await commit(writer, KEY, b"3" * 300)
    writer.reserve(700)  # beyond the capacity and its headroom: evicts KEY2, the least recently used
    writer.release(700)
    await commit(writer, KEY + "4", b"4" * 400)
    assert {m.key: m.data for m in follower.metas()} == {m.key: m.data for m in writer.metas()}
    assert follower.lookup(KEY).data == replaced.data and KEY + "2" not in follower
    await writer.remove(KEY)
    assert KEY not in follower and [m.key for m in follower.metas()] == [KEY + "4"]


async def test_a_removal_returns_once_the_data_file_is_gone(tmp_path):
    store = Store(tmp_path / "s")
    await store.open()
    meta = await commit(store, KEY, b"x" * 100)
    path = store.data_path(meta)
    assert os.path.exists(path)
    assert [m.data for m in await store.remove(KEY)] == [meta.data]
    assert not os.path.exists(path), "a follower still holding the entry must find no file to open"
    meta = await commit(store, KEY, b"y" * 100)
    assert await store.remove_one(meta)
    assert not os.path.exists(store.data_path(meta))


async def test_a_hit_another_worker_served_makes_the_object_recently_used(tmp_path):
    store = Store(tmp_path / "s", capacity=1000)
    await store.open()
    await commit(store, KEY + "a", b"a" * 400)
    await commit(store, KEY + "b", b"b" * 400)
    store.touch(KEY + "a")  # a follower's hit of a, counted here
    store.reserve(500)  # beyond the capacity and its headroom: one object goes
    assert KEY + "a" in store and KEY + "b" not in store


async def test_a_follower_that_finds_a_record_unreadable_deletes_nothing(tmp_path):
    # Only the writer deletes: a follower's row may name a file the writer is replacing or judging itself.
    writer = Store(tmp_path / "s", small_max=0)
    await writer.open()
    meta = await commit(writer, KEY, b"z" * 1000)
    follower = Store(tmp_path / "s", small_max=0, writer=False)
    n, packed = writer.index.packed(0, writer.index.row_span)
    follower.index.add_rows(n, packed)  # a joining worker's copy: rows, no record read
    [record] = Path(writer.data_path(meta)).parent.glob("*.meta")
    record.write_bytes(b"{not json")
    assert follower.lookup(KEY) is None
    await follower.idle()
    assert os.path.exists(writer.data_path(meta)) and record.exists(), "the follower left both files"
    await writer.close()
