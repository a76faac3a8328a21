"""The scrub (cachenode/store/scrub.py): every object read once a pass, what
fails removed as found by the scrub, and never faster than its rate."""

import asyncio
import os

import pytest

from cachenode.store import blocks
from cachenode.store.objects import Meta
from cachenode.store.scrub import Scrub


class FakeStore:
    def __init__(self, root, sizes):
        self.metas_ = []
        for i, size in enumerate(sizes):
            path = root / f"{i}.data"
            path.write_bytes(os.urandom(size))
            fd = os.open(path, os.O_RDONLY)
            sums = blocks.compute(fd, size, block=4096)
            os.close(fd)
            self.metas_.append(Meta(key=f"k{i}", url="", host="h", size=size, headers=(), stored_at=0,
                                    expires_at=1, data=path.name, blocks=sums))
        self.root = root
        self.damaged_ = []

    def metas(self):
        return list(self.metas_)

    async def each_meta(self):
        for meta in list(self.metas_):
            yield meta

    @property
    def used_bytes(self):
        return sum(m.size for m in self.metas_)

    def data_path(self, meta):
        return str(self.root / meta.data)

    def damaged(self, meta, *, found_by, why=""):
        self.damaged_.append((meta.key, found_by, why))
        self.metas_.remove(meta)


async def one_pass(store, *, rate, interval, tick=0.0):
    """The pauses of one pass, on a clock that moves `tick` seconds each time it is read and by every pause
    (so a read of an object seems to take one tick, whatever the machine's load)."""
    slept = []
    now = [0.0]

    def clock():
        now[0] += tick
        return now[0]

    async def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds
        if scrub.passes:
            raise asyncio.CancelledError  # after the pass's own pause

    scrub = Scrub(store, interval=interval, rate=rate, sleep=sleep, clock=clock)
    with pytest.raises(asyncio.CancelledError):
        await scrub.run()
    return slept


async def test_a_pass_reads_no_faster_than_its_rate(tmp_path):
    store = FakeStore(tmp_path, [40_000, 80_000, 120_000])
    slept = await one_pass(store, rate=1_000_000, interval=0)
    # At 1 MB/s, 240 kB take at least 0.24 s, each object its own share.
    assert slept[:3] == pytest.approx([0.04, 0.08, 0.12])
    assert store.damaged_ == []


async def test_the_time_a_read_took_comes_off_its_pause(tmp_path):
    store = FakeStore(tmp_path, [40_000, 80_000, 120_000])
    slept = await one_pass(store, rate=1_000_000, interval=0, tick=0.01)
    assert slept[:3] == pytest.approx([0.03, 0.07, 0.11])


async def test_a_pass_spreads_over_its_interval_when_that_is_slower(tmp_path):
    store = FakeStore(tmp_path, [50_000, 50_000])
    slept = await one_pass(store, rate=10**12, interval=10)
    assert slept[:2] == pytest.approx([5, 5])


async def test_a_changed_byte_is_removed_as_found_by_the_scrub(tmp_path):
    store = FakeStore(tmp_path, [20_000, 20_000])
    with open(tmp_path / "1.data", "r+b") as f:
        f.seek(9000)
        was = f.read(1)
        f.seek(9000)  # the read moved on a byte: written there, 1 in 256 runs changed nothing
        f.write(b"\xff" if was != b"\xff" else b"\x00")
    await one_pass(store, rate=10**12, interval=0)
    [(key, found_by, why)] = store.damaged_
    assert (key, found_by) == ("k1", "scrub") and "block 2 " in why
