"""A small body whole in memory stored in one go (cachenode/store/small.py
`SealedWrites`): one temp file holding body and seal, renamed into place on
commit, or gone with its reserved room on discard, whatever happened first."""

from __future__ import annotations

import errno
import os
import time

import pytest

from cachenode.store import small
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, TooLarge
from nezha.errors import StoreError

HOST = "images.example"
BODY = os.urandom(3000)


def meta(name: str) -> Meta:
    now = time.time()
    return Meta(key=f"http://{HOST}/{name}", url=f"http://{HOST}/{name}", host=HOST, size=0, headers=(),
                stored_at=now, expires_at=now + 60)


@pytest.fixture
async def store(tmp_path):
    s = Store(tmp_path / "store", capacity=10_000)
    await s.open()
    yield s
    await s.idle()
    await s.close()


async def test_a_sealed_write_committed_is_one_sealed_file_the_store_serves_and_reads_back_at_start(store):
    write = store.write_sealed(meta("a"), BODY)
    assert list(store.tmp.iterdir()) == [write.path]
    stored = store.commit_sealed(write)
    store.discard_sealed(write)  # nothing once committed
    assert stored.size == len(BODY) and small.is_sealed(stored) and stored.key in store
    path = store.data_path(stored)
    with open(path, "rb") as f:
        assert f.read(len(BODY)) == BODY
        assert small.check(f.fileno(), stored)
    assert small.read_sealed(type(store.objects)(path)) == stored
    assert list(store.tmp.iterdir()) == [] and store.sizes().used_bytes == len(BODY)


async def test_a_sealed_write_discarded_leaves_no_file_and_gives_its_room_back(store):
    write = store.write_sealed(meta("a"), BODY)
    assert store.index.usage.reserved == len(BODY)
    store.discard_sealed(write)
    store.discard_sealed(write)  # once only
    assert list(store.tmp.iterdir()) == [] and store.index.usage.reserved == 0
    assert "http://images.example/a" not in store


async def test_a_sealed_write_past_the_capacity_is_refused_at_commit_and_its_file_discarded(tmp_path):
    s = Store(tmp_path / "store", capacity=1000)
    await s.open()
    write = s.write_sealed(meta("big"), BODY)
    with pytest.raises(TooLarge, match="3000 bytes exceed the capacity of 1000"):
        s.commit_sealed(write)
    s.discard_sealed(write)
    assert list(s.tmp.iterdir()) == [] and "http://images.example/big" not in s
    await s.close()


async def test_a_sealed_write_the_disk_refuses_raises_a_store_error_naming_it_and_leaves_nothing(store, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(StoreError, match=r"write .*\.part: .*No space left"):
        store.write_sealed(meta("a"), BODY)
    assert list(store.tmp.iterdir()) == [] and store.index.usage.reserved == 0


async def test_a_sealed_write_replacing_an_object_leaves_only_the_new_one_served(store):
    first = store.commit_sealed(store.write_sealed(meta("a"), BODY))
    second = store.commit_sealed(store.write_sealed(meta("a"), BODY[::-1]))
    assert first.data != second.data and store.lookup(second.key) == second
    await store.idle()
    with open(store.data_path(second), "rb") as f:
        assert f.read(len(BODY)) == BODY[::-1]
    assert not os.path.exists(store.data_path(first))
