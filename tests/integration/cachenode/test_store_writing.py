"""The store's one way to write an object (cachenode/store/writing.py): a
write owns its temp file and its reserved room until it is committed or
discarded, whatever ends the block it is written in.

Reserved room is seen the way the rest of the node sees it: a reservation
that would take the store past its capacity evicts the least recently used
object."""

from __future__ import annotations

import time

import pytest

from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.errors import StoreError

HOST = "www.cs.toronto.edu"
CAPACITY = 100


def meta(name: str) -> Meta:
    now = time.time()
    return Meta(key=f"http://{HOST}/{name}", url=f"http://{HOST}/{name}", host=HOST, size=0, headers=(),
                stored_at=now, expires_at=now + 60)


@pytest.fixture
async def store(tmp_path):
    """A store of CAPACITY bytes holding one object of 60 bytes, `/held`."""
    s = Store(tmp_path / "store", capacity=CAPACITY, small_max=0)  # data files hold their bodies alone
    await s.open()
    async with s.writing(reserve=60) as write:
        await s.write(write.temp, b"h" * 60)
        await write.commit(meta("held"))
    yield s
    await s.idle()


async def test_a_committed_write_is_the_stored_object_and_its_block_ending_discards_nothing(store):
    async with store.writing(reserve=10) as write:
        await store.write(write.temp, b"0123456789")
        stored = await write.commit(meta("new"))
    assert write.stored == stored and stored.size == 10
    with open(store.data_path(stored), "rb") as f:
        assert f.read() == b"0123456789"
    assert list(store.tmp.iterdir()) == []


async def test_a_write_its_block_breaks_off_leaves_no_temp_file_and_gives_its_room_back(store):
    with pytest.raises(RuntimeError, match="the source broke off"):
        async with store.writing(reserve=30) as write:
            await store.write(write.temp, b"x" * 10)
            raise RuntimeError("the source broke off")
    assert list(store.tmp.iterdir()) == [] and "http://www.cs.toronto.edu/new" not in store
    # 60 held + 40 asked fit only if the 30 that write held were given back.
    async with store.writing(reserve=40):
        assert "http://www.cs.toronto.edu/held" in store


async def test_a_reservation_beyond_the_capacity_evicts_before_the_bytes_arrive(store):
    async with store.writing(reserve=50):
        assert "http://www.cs.toronto.edu/held" not in store


async def test_a_write_ended_by_hand_gives_its_room_back_and_may_be_ended_again(store):
    write = await store.writing(reserve=30).open()
    await write.discard()
    await write.discard()  # as a fill does, on the error that follows a failed write
    assert list(store.tmp.iterdir()) == []
    async with store.writing(reserve=40):
        assert "http://www.cs.toronto.edu/held" in store


async def test_a_write_that_must_reach_the_disk_is_refused_before_it_reserves_room(store):
    """An assembly has no way around the disk: a temp file that cannot be
    created refuses it at once, evicting nothing for room it will never use."""
    store.tmp.rmdir()  # any failure to create the file in tmp/ (ENOSPC, EDQUOT, ENOENT...) alike
    with pytest.raises(StoreError, match="create"):
        await store.writing(reserve=50, must_write=True).open()
    assert "http://www.cs.toronto.edu/held" in store


async def test_a_write_that_may_stream_through_memory_takes_the_stand_in_file(store):
    """A fill carries on from memory when the disk refuses (cachenode/fill/buffer.py), so it is given
    the stand-in every write to which fails, and its room as asked."""
    store.tmp.rmdir()
    async with store.writing(reserve=50) as write:
        assert write.temp.unwritable is not None and write.temp.unwritable.startswith("create ")
        with pytest.raises(StoreError, match="create"):
            await store.write(write.temp, b"x")
        assert "http://www.cs.toronto.edu/held" not in store
