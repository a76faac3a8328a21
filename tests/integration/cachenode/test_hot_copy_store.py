"""The store's share for hot copies: bounded by hot_capacity, least recently used first, and evicted before
any object the node owns when room is needed; the mark survives a restart."""

from __future__ import annotations

import os
import time

import pytest

from cachenode.store.disk import Store
from cachenode.store.objects import Meta, TooLarge

HOST = "www.cs.toronto.edu"


def key(name: str) -> str:
    return f"http://{HOST}/{name}"


async def put(store: Store, name: str, size: int, *, hot: bool = False) -> Meta:
    temp = await store.new_temp()
    os.close(temp.read_fd)
    await store.write(temp, name[0].encode() * size)
    now = time.time()
    return await store.commit(temp, Meta(key=key(name), url=key(name), host=HOST, size=0, headers={},
                                         stored_at=now, expires_at=now + 600, hot=hot))


async def test_hot_copies_stay_within_their_share_least_recently_used_going_first(tmp_path):
    store = Store(tmp_path, capacity=10_000, hot_capacity=1_000, small_max=0)  # data files hold their bodies alone
    await store.open()
    await put(store, "owned", 5_000)
    await put(store, "h1", 400, hot=True)
    await put(store, "h2", 400, hot=True)
    store.lookup(key("h1"))  # h2 is now the least recently used hot copy
    await put(store, "h3", 400, hot=True)
    await store.idle()
    assert set(store.keys()) == {key("owned"), key("h1"), key("h3")}
    assert store.hot_bytes == 800 and store.used_bytes == 5_800
    on_disk = sum(p.stat().st_size for p in store.objects.rglob("*.data"))
    assert on_disk == 5_800


async def test_hot_copies_are_evicted_before_an_owned_object_however_recently_read(tmp_path):
    evicted: list[Meta] = []
    store = Store(tmp_path, capacity=2_000, hot_capacity=1_000, on_evict=evicted.append)
    await store.open()
    await put(store, "old", 800)
    await put(store, "hot", 800, hot=True)
    store.lookup(key("hot"))  # read last: plain LRU would evict `old`
    await put(store, "new", 800)
    assert [m.key for m in evicted] == [key("hot")] and evicted[0].hot
    assert set(store.keys()) == {key("old"), key("new")} and store.hot_bytes == 0


async def test_a_hot_copy_larger_than_the_share_is_not_stored(tmp_path):
    store = Store(tmp_path, capacity=10_000, hot_capacity=1_000)
    await store.open()
    with pytest.raises(TooLarge, match="hot copies' share of 1000 bytes"):
        await put(store, "big", 1_001, hot=True)
    await put(store, "big", 1_001)  # the same size owned is stored
    assert store.hot_bytes == 0 and len(store) == 1


async def test_a_commit_over_a_hot_copy_replaces_it_with_an_owned_object(tmp_path):
    store = Store(tmp_path, capacity=10_000, hot_capacity=1_000)
    await store.open()
    await put(store, "k", 500, hot=True)
    meta = await put(store, "k", 500)
    assert not meta.hot and store.hot_bytes == 0 and store.lookup(key("k")) is meta


async def test_the_hot_mark_survives_a_restart_and_the_share_is_enforced_at_open(tmp_path):
    store = Store(tmp_path, capacity=10_000, hot_capacity=1_000)
    await store.open()
    await put(store, "a", 600, hot=True)
    await put(store, "b", 300, hot=True)
    await store.idle()
    reopened = Store(tmp_path, capacity=10_000, hot_capacity=500)  # the share was lowered meanwhile
    await reopened.open()
    await reopened.idle()
    assert reopened.keys() == [key("b")] and reopened.lookup(key("b")).hot and reopened.hot_bytes == 300
