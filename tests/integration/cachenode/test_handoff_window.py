"""A hand-off walks the store a slice at a time and has at most `WINDOW`
objects on their way at once, however many it holds (cachenode/cluster/handoff.py):
each still reaches its new owner, and objects that stay here are no work."""

from __future__ import annotations

import asyncio
import contextlib
import os

from cachenode.cluster import handoff
from nezha.ring import Membership
from tests.integration.cachenode.conftest import key_of, owner_and_other, until


async def test_a_hand_off_of_many_objects_keeps_at_most_its_window_on_their_way(origin, cluster, session, monkeypatch):
    monkeypatch.setattr(handoff, "WINDOW", 6)
    small = [f"/w/{i}.jpg" for i in range(60)]
    large = [f"/w/{i}.bin" for i in range(4)]
    for p in small:
        origin.put(p, p.encode() * 30)
    for p in large:
        origin.put(p, p.encode() * 20_000)  # beyond the small objects' bound: copied one by one
    nodes, members = await cluster(2, replica_batch=4)
    leaving, staying = nodes["n1"], nodes["n0"]
    leaving.node.cluster.update(Membership(2, {"n1": members.nodes["n1"]}))  # it alone fills them all
    for p in small + large:
        status, _, _ = await leaving.get(session, p)
        assert status == 200
    await leaving.node.settled()
    on_their_way = peak = 0
    batches, copies = leaving.node.handoff.replicas.batches, leaving.node.handoff.replicas

    def counted(send):
        async def one(*args, **kwargs):
            nonlocal on_their_way, peak
            on_their_way += 1
            peak = max(peak, on_their_way)
            try:
                return await send(*args, **kwargs)
            finally:
                on_their_way -= 1
        return one

    add = batches.add
    monkeypatch.setattr(batches, "add", counted(lambda *a: asyncio.ensure_future(add(*a))))
    monkeypatch.setattr(copies, "ask_to_copy", counted(copies.ask_to_copy))
    async with session.post(leaving.url + "/_nezha/handoff", json={"nodes": {"n0": members.nodes["n0"]}}) as r:
        assert r.status == 202
    await until(lambda: leaving.node.handoff.progress.state == "done", timeout=30.0)
    progress = leaving.node.handoff.progress
    assert (progress.total, progress.done, progress.copied, progress.failed) == (64, 64, 64, 0)
    assert 1 < peak <= 6
    assert all(key_of(p) in staying.node.store for p in small + large)


async def test_objects_whose_owners_are_this_node_alone_are_no_work_for_a_hand_off(origin, cluster, session):
    paths = [f"/s/{i}.jpg" for i in range(40)]
    for p in paths:
        origin.put(p, p.encode() * 30)
    nodes, members = await cluster(2)
    mine = [p for p in paths if owner_and_other(nodes, p)[0] == ["n0"]]
    for p in mine:
        await nodes["n0"].get(session, p)
    await nodes["n0"].node.settled()
    async with session.post(nodes["n0"].url + "/_nezha/handoff", json={"nodes": members.nodes}) as r:
        assert r.status == 202
    await until(lambda: nodes["n0"].node.handoff.progress.state == "done", timeout=10.0)
    progress = nodes["n0"].node.handoff.progress
    assert (progress.total, progress.done, progress.copied, progress.present, progress.failed) == (len(mine), len(mine),
                                                                                                  0, 0, 0)


def descriptors_under(folder) -> int:
    """This process's open descriptors on files under `folder` (the in-process nodes share it)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder)):
                count += 1
    return count


async def test_objects_received_in_batches_hold_no_descriptor_once_stored(origin, cluster, session):
    """A node receiving a hand-off of a million small objects must not keep a descriptor per object."""
    paths = [f"/fd/{i}.jpg" for i in range(40)]
    for p in paths:
        origin.put(p, p.encode() * 30)
    nodes, members = await cluster(2)
    leaving, staying = nodes["n1"], nodes["n0"]
    leaving.node.cluster.update(Membership(2, {"n1": members.nodes["n1"]}))
    for p in paths:
        await leaving.get(session, p)
    await leaving.node.settled()
    before = descriptors_under(staying.node.store.root)
    async with session.post(leaving.url + "/_nezha/handoff", json={"nodes": {"n0": members.nodes["n0"]}}) as r:
        assert r.status == 202
    await until(lambda: leaving.node.handoff.progress.state == "done", timeout=10.0)
    assert leaving.node.handoff.progress.copied == 40
    assert all(key_of(p) in staying.node.store for p in paths)
    assert descriptors_under(staying.node.store.root) - before < 5
