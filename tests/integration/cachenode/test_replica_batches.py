"""A batch of small objects' replicas leaves at its count or after its delay (cachenode/cluster/replica_batches.py).

Two nodes in one process, both owners of every key: the first owner's fills
push their replicas to the other in batches of at most `replica_batch`; a
lone object is not held back for a batch to fill; with `replica_batch: 0`
every replica goes one by one, as a large object's does.
"""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from tests.integration.cachenode.conftest import key_of, owner_and_other, until


def sent(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "replicas_sent"]


async def fill_all(nodes, session, owner: str, paths: list[str], bodies: list[bytes]) -> None:
    async def one(p: str, body: bytes) -> None:
        status, _, got = await nodes[owner].get(session, p)
        assert status == 200 and got == body

    await asyncio.gather(*(one(p, b) for p, b in zip(paths, bodies)))
    await asyncio.gather(*(n.node.settled() for n in nodes.values()))


async def test_every_small_replica_arrives_in_batches_of_at_most_replica_batch_none_one_by_one(origin, cluster, session):
    paths = [f"/many/{i}.jpg" for i in range(23)]
    bodies = [bytes([i]) * (2000 + i) for i in range(23)]
    for p, b in zip(paths, bodies):
        origin.put(p, b)
    nodes, _ = await cluster(2, replicas=2, replica_batch=5)
    with capture_logs() as logs:
        for p, b in zip(paths, bodies):  # the first owner of each fills it
            owners, _ = owner_and_other(nodes, p, replicas=2)
            status, _, got = await nodes[owners[0]].get(session, p)
            assert status == 200 and got == b
        await asyncio.gather(*(n.node.settled() for n in nodes.values()))
    batches = sent(logs)
    assert sum(b["records"] for b in batches) == 23 and all(b["copied"] == b["records"] for b in batches)
    assert max(b["records"] for b in batches) <= 5
    for p in paths:
        assert all(key_of(p) in n.node.store for n in nodes.values())
    assert not [e for e in logs if e["event"] == "replicated"], "a small object's replica went one by one"


async def test_a_burst_fills_batches_to_replica_batch_objects_and_sends_the_rest_after_them(origin, cluster, session):
    nodes, _ = await cluster(2, replicas=2, replica_batch=4)
    owner = owner_and_other(nodes, "/x", replicas=2)[0][0]
    paths = [p for p in (f"/burst/{i}.jpg" for i in range(200)) if owner_and_other(nodes, p, replicas=2)[0][0] == owner][:18]
    bodies = [p.encode() * 50 for p in paths]
    for p, b in zip(paths, bodies):
        origin.put(p, b)
    with capture_logs() as logs:
        await fill_all(nodes, session, owner, paths, bodies)
    batches = sent(logs)
    assert sum(b["records"] for b in batches) == 18 and max(b["records"] for b in batches) == 4
    other = next(n for nid, n in nodes.items() if nid != owner)
    assert all(key_of(p) in other.node.store for p in paths)


async def test_a_lone_small_object_is_not_held_back_waiting_for_others(origin, cluster, session):
    origin.put("/alone.jpg", b"a" * 5000)
    nodes, _ = await cluster(2, replicas=2)
    owners, _ = owner_and_other(nodes, "/alone.jpg", replicas=2)
    with capture_logs() as logs:
        status, _, _ = await nodes[owners[0]].get(session, "/alone.jpg")
        assert status == 200
        # Nothing else is filled: without the batch's delay (0.2 s) it would wait for company forever.
        await until(lambda: key_of("/alone.jpg") in nodes[owners[1]].node.store, timeout=60)
        # The peer stores the batch before it answers, and the sender logs the batch once the answer is in:
        # the copy can be seen on the peer a moment before its line is written.
        await until(lambda: sent(logs), timeout=60)
    assert [b["records"] for b in sent(logs)] == [1]


async def test_with_replica_batch_0_every_replica_goes_one_by_one(origin, cluster, session):
    paths = [f"/single/{i}.jpg" for i in range(4)]
    for p in paths:
        origin.put(p, p.encode() * 100)
    nodes, _ = await cluster(2, replicas=2, replica_batch=0)
    with capture_logs() as logs:
        for p in paths:
            owners, _ = owner_and_other(nodes, p, replicas=2)
            await nodes[owners[0]].get(session, p)
        await asyncio.gather(*(n.node.settled() for n in nodes.values()))
    assert not sent(logs)
    assert len([e for e in logs if e["event"] == "replicated"]) == 4
    for p in paths:
        assert all(key_of(p) in n.node.store for n in nodes.values())


async def test_a_hand_off_sends_its_small_objects_in_batches_and_counts_each(origin, cluster, session):
    """Not `parallel` (4) at a time: every small object of the leaving node goes in one batch to its new owner."""
    paths = [f"/leave/{i}.jpg" for i in range(40)]
    for p in paths:
        origin.put(p, p.encode() * 40)
    nodes, members = await cluster(2)
    owned = [p for p in paths if owner_and_other(nodes, p)[0] == ["n1"]]
    for p in owned:
        await nodes["n1"].get(session, p)
    await nodes["n1"].node.settled()
    with capture_logs() as logs:
        async with session.post(nodes["n1"].url + "/_nezha/handoff", json={"nodes": {"n0": members.nodes["n0"]}}) as r:
            assert r.status == 202
        await until(lambda: nodes["n1"].node.handoff.progress.state == "done", timeout=10.0)
    progress = nodes["n1"].node.handoff.progress
    assert (progress.copied, progress.failed, progress.total) == (len(owned), 0, len(owned))
    assert progress.bytes == sum(len(p.encode() * 40) for p in owned)
    assert [b["records"] for b in sent(logs)] == [len(owned)]
    assert all(key_of(p) in nodes["n0"].node.store for p in owned)
