"""A small body whole in memory stored in one go (cachenode/store/small.py
`SealedWrites.put_sealed`): one file holding body and seal, created under its
final name, or no file at all and its reserved room given back when the store
refuses it or the disk does."""

from __future__ import annotations

import errno
import math
import os
import random
import time

import pytest

from cachenode.store import small
from cachenode.store.disk import Store
from cachenode.store.objects import TooLarge
from nezha.errors import StoreError

HOST = "images.example"
BODY = os.urandom(3000)


def put(store: Store, name: str, body: bytes = BODY):
    now = time.time()
    return store.put_sealed(body, key=f"http://{HOST}/{name}", url=f"http://{HOST}/{name}", host=HOST,
                            headers=(), stored_at=now, expires_at=now + 60)


@pytest.fixture
async def store(tmp_path):
    s = Store(tmp_path / "store", capacity=10_000)
    await s.open()
    yield s
    await s.idle()
    await s.close()


async def test_a_sealed_write_is_one_sealed_file_the_store_serves_and_reads_back_at_start(store):
    stored = put(store, "a")
    assert stored.size == len(BODY) and small.is_sealed(stored) and stored.key in store
    path = store.data_path(stored)
    with open(path, "rb") as f:
        assert f.read(len(BODY)) == BODY
        assert small.check(f.fileno(), stored)
    assert small.read_sealed(type(store.objects)(path)) == stored
    assert list(store.tmp.iterdir()) == [] and store.sizes().used_bytes == len(BODY)
    assert store.index.usage.reserved == 0


async def test_a_sealed_write_past_the_capacity_is_refused_and_leaves_no_file_and_no_room_taken(tmp_path):
    s = Store(tmp_path / "store", capacity=1000)
    await s.open()
    with pytest.raises(TooLarge, match="3000 bytes exceed the capacity of 1000"):
        put(s, "big")
    assert list(s.tmp.iterdir()) == [] and "http://images.example/big" not in s
    assert s.index.usage.reserved == 0 and s.sizes().used_bytes == 0
    await s.close()


async def test_a_sealed_write_the_disk_refuses_raises_a_store_error_naming_it_and_leaves_nothing(store, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(StoreError, match=r"write .*\.obj: .*No space left"):
        put(store, "a")
    assert list(store.tmp.iterdir()) == [] and store.index.usage.reserved == 0
    assert list(store.objects.rglob(f"*{small.SUFFIX}")) == []
    assert "http://images.example/a" not in store


async def test_a_sealed_write_the_disk_takes_in_short_writes_goes_on_until_the_file_is_whole(store, monkeypatch):
    """Each write taking at most 1000 bytes (a file system that writes less than asked) still
    leaves the whole file: body and seal, each write from where the last one stopped."""
    real_pwrite, asked = os.pwrite, []

    def short(fd, data, offset):
        asked.append((len(data), offset))
        return real_pwrite(fd, bytes(data)[:1000], offset)

    monkeypatch.setattr(os, "pwrite", short)
    stored = put(store, "a")
    monkeypatch.undo()
    size = os.path.getsize(store.data_path(stored))
    assert asked == [(size - at, at) for at in range(0, size, 1000)]
    with open(store.data_path(stored), "rb") as f:
        assert f.read(len(BODY)) == BODY and small.check(f.fileno(), stored)


async def test_a_sealed_write_stores_the_meta_sealed_meta_names_for_its_record(store):
    """`put_sealed` builds its Meta from its keywords as they came (`_sealed_meta`), which must be what
    `sealed_meta` gives for them: the same fields, the same nonce from the same generator state."""
    now = 1795922793.3171613
    record = dict(url=f"http://{HOST}/v?x", host=HOST, headers=(("ETag", '"x"'), ("X-Caf\u00e9", "\u00e9")),
                  stored_at=now, expires_at=now + 60, stale_if_error=math.inf, age=3, status=404, authorize=True)
    for vary, variant, hot in (((), "", False), (("accept",), "image/webp", False), ((), "", True)):
        state = random.getstate()
        expected = small.sealed_meta(len(BODY), key=f"http://{HOST}/v", vary=vary, variant=variant, hot=hot,
                                     extra=False, **record)
        random.setstate(state)
        assert store.put_sealed(BODY, key=f"http://{HOST}/v", vary=vary, variant=variant, hot=hot, **record) == expected


async def test_a_sealed_write_replacing_an_object_leaves_only_the_new_one_served(store):
    first = put(store, "a")
    second = put(store, "a", BODY[::-1])
    assert first.data != second.data and store.lookup(second.key) == second
    await store.idle()
    with open(store.data_path(second), "rb") as f:
        assert f.read(len(BODY)) == BODY[::-1]
    assert not os.path.exists(store.data_path(first))
