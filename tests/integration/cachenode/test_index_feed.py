"""A follower joining a primary that holds many objects gets the index as rows,
in slices that give the primary's loop back between them, and ends with the
primary's index however the primary's changes interleave with the slices
(cachenode/workers/index_feed.py, cachenode/store/following.py)."""

from __future__ import annotations

import asyncio
import os
import time

from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.workers import index_feed
from cachenode.workers.follower import meta_from
from cachenode.workers.index_feed import IndexFeed
from cachenode.workers.messages import Drop, Put, Rows, Synced

HOST = "www.cs.toronto.edu"
KEY = f"http://{HOST}/k"


async def commit(store: Store, key: str, body: bytes, **fields) -> Meta:
    temp = await store.new_temp()
    os.close(temp.read_fd)
    await store.write(temp, body)
    now = time.time()
    return await store.commit(temp, Meta(key=key, url=key, host=HOST, size=0, headers=[], stored_at=now,
                                         expires_at=now + 600, **fields))


class Link:
    """A follower's end of a link that reads a record a millisecond, applying
    each as the follower does (its `_record`): a join outpacing it waits."""

    def __init__(self, follower: Store) -> None:
        self.follower = follower
        self.records: list[str] = []
        self.pending: list[tuple] = []
        self.closed = False
        self.reader = asyncio.ensure_future(self._read())

    @property
    def queued(self) -> int:
        return len(self.pending)

    def send(self, message, tail: bytes = b"", fds=()) -> None:
        self.records.append(message.TAG)
        self.pending.append((message, tail))

    async def _read(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            if not self.pending:
                continue
            message, tail = self.pending.pop(0)
            match message:
                case Rows(n=n):
                    self.follower.index.add_rows(n, tail)
                case Put() | Drop():
                    for raw in message.metas:
                        self.follower.mirror(message.TAG, meta_from(raw))

    async def applied(self) -> None:
        """Every record sent so far applied by the follower (the reader goes on)."""
        while self.pending:
            await asyncio.sleep(0.001)

    async def drained(self) -> None:
        await self.applied()
        self.reader.cancel()


def held(store: Store) -> dict[str, str]:
    return {m.slot: m.data for m in store.metas()}


async def test_a_join_interleaved_with_changes_leaves_the_follower_with_the_primarys_index(tmp_path, monkeypatch):
    monkeypatch.setattr(index_feed, "ROWS_PER_RECORD", 2)
    writer = Store(tmp_path / "s")
    await writer.open()
    for i in range(30):
        await commit(writer, f"{KEY}{i}", b"x" * (10 + i))
    await commit(writer, KEY + "v", b"v" * 50, vary=("accept",), variant="accept=a")  # kept whole: goes as a record
    follower = Store(tmp_path / "s")  # the same folder, never opened: it only follows
    links: dict = {}
    feed = IndexFeed(writer, links)
    writer.watchers.append(feed.changed)
    link = links[1] = Link(follower)
    joining = feed.join(1, link)
    # The primary goes on changing its index while the join runs: replaced, removed, added objects.
    for i in range(0, 30, 3):
        await asyncio.sleep(0)
        await commit(writer, f"{KEY}{i}", b"y" * 7)
        await writer.remove(f"{KEY}{i + 1}")
        await commit(writer, f"{KEY}new{i}", b"z" * 5)
    await joining
    await link.drained()
    before = link.records[:link.records.index(Synced.TAG)]
    assert before.count("rows") >= 10 and "drop" in before, "the changes came while the join ran"
    assert held(follower) == held(writer)
    assert len(follower) == len(writer) and follower.used_bytes == writer.used_bytes
    got = follower.lookup(f"{KEY}0")
    assert got is not None and got.data == writer.lookup(f"{KEY}0").data and got.size == 7
    assert follower.lookup(f"{KEY}1") is None


async def test_a_join_gives_the_loop_back_between_slices(tmp_path, monkeypatch):
    monkeypatch.setattr(index_feed, "ROWS_PER_RECORD", 4)
    writer = Store(tmp_path / "s")
    await writer.open()
    for i in range(40):
        await commit(writer, f"{KEY}{i}", b"x" * 10)
    link = Link(Store(tmp_path / "s"))
    feed = IndexFeed(writer, {1: link})
    turns = []

    async def other_work() -> None:
        while True:
            turns.append(len(link.records))
            await asyncio.sleep(0)

    beside = asyncio.ensure_future(other_work())
    await feed.join(1, link)
    await link.drained()
    beside.cancel()
    # The other work ran between the slices, not only before or after the join.
    assert len({n for n in turns if 0 < n < len(link.records)}) >= 5


async def test_the_start_up_scans_objects_go_to_followers_as_rows_and_leave_them_with_the_index(tmp_path):
    writer = Store(tmp_path / "s")
    await writer.open()
    for i in range(20):
        await commit(writer, f"{KEY}{i}", b"x" * (5 + i))
    await writer.close()
    restarted = Store(tmp_path / "s")
    follower = Store(tmp_path / "s")
    link = Link(follower)
    feed = IndexFeed(restarted, {1: link})
    restarted.watchers.append(feed.changed)
    await restarted.open(background=True)
    await feed.join(1, link)
    await restarted.loaded()
    await commit(restarted, f"{KEY}0", b"new")  # a change after the loads: they went before it
    await link.drained()
    assert "put" not in link.records[:link.records.index("synced")]
    assert held(follower) == held(restarted) and len(held(follower)) == 20
    assert follower.lookup(f"{KEY}0").size == 3


async def test_stored_objects_go_as_rows_gathered_per_loop_turn_and_a_refresh_as_its_record(tmp_path):
    """A burst of fills costs the primary a row each, not a record (index_feed.py); a refresh changes a
    record the follower may already hold in memory, so it goes whole and the follower serves the new one."""
    writer = Store(tmp_path / "s")
    await writer.open()
    follower = Store(tmp_path / "s")
    link = Link(follower)
    feed = IndexFeed(writer, {1: link})
    writer.watchers.append(feed.changed)
    await feed.join(1, link)
    stored = await asyncio.gather(*(commit(writer, f"{KEY}{i}", b"x" * (3 + i)) for i in range(40)))
    await asyncio.sleep(0)  # the loop turns: the rows gathered go
    after = link.records[link.records.index(Synced.TAG) + 1:]
    assert set(after) == {"rows"} and len(after) < 40, after
    await link.applied()  # the link reads a record a millisecond
    old = follower.lookup(f"{KEY}0")  # read from its file, and held in the follower's memory since
    assert old is not None and old.expires_at == stored[0].expires_at
    now = time.time()
    await writer.refresh(stored[0], headers=[("x-refreshed", "1")], stored_at=now, expires_at=now + 9000,
                         stale_if_error=0, stale_while_revalidate=0)
    await writer.remove(f"{KEY}1")
    await link.drained()
    assert link.records[-2:] == ["put", "drop"]
    assert held(follower) == held(writer) and len(held(follower)) == 39
    got = follower.lookup(f"{KEY}0")
    assert got is not None and got.expires_at == now + 9000 and ("x-refreshed", "1") in [tuple(h) for h in got.headers]
