"""Streaming copies (cachenode/cluster/streaming_copies.py): the readers of a cold object on one node share
one stream from the key's owner, kept as the node's copy while it arrives, instead of one relay each.

In-process nodes on 127.0.0.1 sharing one ring (the `cluster` fixture); with real processes, the owner killed
mid-fill: tests/integration/cluster/test_streaming_copies_processes.py.
"""

from __future__ import annotations

import asyncio
import os
import re

from structlog.testing import capture_logs

from tests.integration.cachenode.conftest import key_of, owner_and_other, until

MiB = 1 << 20
PATH = "/datasets/stampede/shard-0.tar"
KEY = key_of(PATH)
BODY = os.urandom(MiB)


async def requests_answered(node, session) -> dict[str, float]:
    """nezha_requests_total on `node`, by cache outcome (those it answered at least once)."""
    async with session.get(node.url + "/metrics") as r:
        text = await r.text()
    found = {m.group(1): float(m.group(2))
             for m in re.finditer(r'^nezha_requests_total\{cache="([^"]+)"\} (\S+)$', text, re.M)}
    return {cache: n for cache, n in found.items() if n and cache not in ("admin", "internal")}


async def test_readers_of_a_cold_object_on_a_non_owner_share_one_stream_from_the_owner_kept_as_a_hot_copy(
        origin, cluster, session):
    """Six reads at once through a non-owner of a cold object the origin sends in about a second: the owner
    is asked once (not six times), the copy here starts while the owner's fill runs, every reader gets exact
    bytes from it (`hot-miss`), and it stays as a hot copy that the next read hits."""
    origin.put(PATH, BODY, rate=MiB, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, hot_reads=3)
    (owner,), (reader, _) = owner_and_other(nodes, PATH)
    with capture_logs() as logs:
        results = await asyncio.gather(*(nodes[reader].get(session, PATH) for _ in range(6)))
        await nodes[reader].node.settled()
        await nodes[owner].node.settled()
    assert [(status, body == BODY) for status, _, body in results] == [(200, True)] * 6
    assert [headers["X-Nezha-Cache"] for _, headers, _ in results] == ["hot-miss"] * 6
    assert await requests_answered(nodes[owner], session) == {"miss": 1.0}, "one stream from the owner"
    events = [(e["event"], e.get("source")) for e in logs]
    assert events.index(("streaming_copy_started", owner)) < events.index(("fill_completed", "origin")), \
        "the copy began while the owner's fill ran"
    assert origin.requests[PATH] == 1
    copy = nodes[reader].node.store.lookup(KEY)
    assert copy is not None and copy.hot and copy.size == len(BODY)
    status, headers, body = await nodes[reader].get(session, PATH)
    assert (status, headers["X-Nezha-Cache"], body == BODY) == (200, "hot-hit", True)


async def test_a_copy_the_owner_cut_because_its_origin_died_goes_on_from_the_origin_and_the_owner_stays_up(
        origin, cluster, session):
    """The origin drops the owner's fill halfway, so the owner cuts the stream the non-owner's copy reads from.
    The non-owner asks why, is told the owner's fill failed, and does not mark it down (it is alive); its copy
    goes on from the origin under If-Range, and every reader gets exact bytes."""
    origin.put(PATH, BODY, rate=MiB, die_after=MiB // 2, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, hot_reads=3)
    (owner,), (reader, _) = owner_and_other(nodes, PATH)
    with capture_logs() as logs:
        results = await asyncio.gather(*(nodes[reader].get(session, PATH) for _ in range(6)))
        await nodes[reader].node.settled()
    assert [(status, headers["X-Nezha-Cache"], body == BODY) for status, headers, body in results] == \
        [(200, "hot-miss", True)] * 6
    assert [e["source"] for e in logs if e["event"] == "streaming_copy_resumed"] == [owner]
    downs = [(e["peer"], e["reason"]) for e in logs if e["event"] == "peer_marked_down"]
    assert downs == [], f"a live owner was marked down for its origin's failure: {downs}"
    assert [e["peer"] for e in logs if e["event"] == "peer_fill_failed"] == [owner]
    assert not nodes[reader].node.relay.is_down(nodes[reader].node.cluster.peer(owner))
    ranges = [h.get("Range") for h in origin.request_headers]
    assert ranges[0] is None and len(ranges) == 2 and ranges[1].endswith(f"-{MiB - 1}"), ranges


async def test_a_second_owner_whose_own_fill_failed_under_the_copys_rest_is_asked_and_stays_up(
        origin, cluster, session):
    """Two owners; the origin drops the first owner's fill halfway and cuts the second owner's first ranged
    answer too, so the copy's rest, read from the second owner, breaks off as well. The non-owner asks the
    second owner why, as it asked the first, is told its fill failed, and marks neither down (both are
    alive); the rest comes from the origin and every reader gets exact bytes."""
    origin.put(PATH, BODY, rate=MiB, die_after=MiB // 2, range_die_after=MiB // 8, range_cuts=1,
               headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, replicas=2, hot_reads=3)
    (first, second), (reader,) = owner_and_other(nodes, PATH, replicas=2)
    with capture_logs() as logs:
        results = await asyncio.gather(*(nodes[reader].get(session, PATH) for _ in range(6)))
        await nodes[reader].node.settled()
    assert [(status, headers["X-Nezha-Cache"], body == BODY) for status, headers, body in results] == \
        [(200, "hot-miss", True)] * 6
    assert [e["peer"] for e in logs if e["event"] == "peer_fill_failed"] == [first, second]
    downs = [(e["peer"], e["reason"]) for e in logs if e["event"] == "peer_marked_down"]
    assert downs == [], f"a live owner was marked down for its origin's failure: {downs}"
    for owner in (first, second):
        assert not nodes[reader].node.relay.is_down(nodes[reader].node.cluster.peer(owner))


async def test_a_read_alone_is_relayed_as_before_and_makes_no_copy(origin, cluster, session):
    """One read of a cold object through a non-owner: nothing waits on its answer, so it is relayed
    (`peer-miss`) and no copy is kept (a key read once is not copied)."""
    origin.put(PATH, BODY, rate=4 * MiB, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, hot_reads=3)
    (owner,), (reader, _) = owner_and_other(nodes, PATH)
    status, headers, body = await nodes[reader].get(session, PATH)
    assert (status, headers["X-Nezha-Cache"], body == BODY) == (200, "peer-miss", True)
    await nodes[reader].node.settled()
    assert nodes[reader].node.store.lookup(KEY) is None


async def test_with_hot_copies_off_every_reader_is_relayed(origin, cluster, session):
    origin.put(PATH, BODY, rate=2 * MiB, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, hot_reads=0)
    (owner,), (reader, _) = owner_and_other(nodes, PATH)
    results = await asyncio.gather(*(nodes[reader].get(session, PATH) for _ in range(4)))
    assert {(status, body == BODY) for status, _, body in results} == {(200, True)}
    assert {headers["X-Nezha-Cache"] for _, headers, _ in results} <= {"peer-miss", "peer-miss-joined"}
    assert sum((await requests_answered(nodes[owner], session)).values()) == 4
    await nodes[reader].node.settled()
    assert nodes[reader].node.store.lookup(KEY) is None


async def test_a_second_owners_readers_share_one_stream_kept_as_its_replica(origin, cluster, session):
    """R = 2: the second owner's readers of a cold object share one stream from the first owner too; what it
    keeps is its replica (not a hot copy), so the first owner's push finds it present."""
    origin.put(PATH, BODY, rate=MiB, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, replicas=2, hot_reads=3)
    (first, second), _ = owner_and_other(nodes, PATH, replicas=2)
    results = await asyncio.gather(*(nodes[second].get(session, PATH) for _ in range(4)))
    assert [(status, headers["X-Nezha-Cache"], body == BODY) for status, headers, body in results] == \
        [(200, "hot-miss", True)] * 4
    assert await requests_answered(nodes[first], session) == {"miss": 1.0}
    await until(lambda: nodes[second].node.store.lookup(KEY) is not None)
    await nodes[first].node.settled()
    await nodes[second].node.settled()
    replica = nodes[second].node.store.lookup(KEY)
    assert not replica.hot and replica.size == len(BODY)
    assert origin.requests[PATH] == 1


async def test_copies_feed_copies_in_a_chain_so_no_node_sends_more_than_one_stream(origin, cluster, session):
    """Five nodes, R = 2, four reads at once through each: in the key's order of nodes each node's copy
    feeds the next one's (cluster/streaming.py `feeds_from`, a chain up to 16 nodes): the first owner
    answers its own four reads and one copy, not four; every other node its own four and the copy of the
    node behind it; every read is exact; the origin is asked once."""
    origin.put(PATH, BODY, rate=MiB, headers={"Cache-Control": "max-age=3600", "ETag": '"v1"'})
    nodes, members = await cluster(5, replicas=2, hot_reads=3)
    order = [p.id for p in nodes["n0"].node.cluster.owners(KEY, 5)]
    results = await asyncio.gather(*(nodes[n].get(session, PATH) for n in order for _ in range(4)))
    assert [(status, body == BODY) for status, _, body in results] == [(200, True)] * 20
    for node in nodes.values():
        await node.node.settled()
    first = await requests_answered(nodes[order[0]], session)
    # Every head read asks the first owner first (its answer says whether the object is filling); the
    # three nodes behind the second owner close theirs once their feeder answers: the first owner sends
    # 4 + 1 whole bodies.
    assert sum(first.values()) == 8 and first.get("hot-miss", 0) == 0, first
    for n in order[1:-1]:
        assert await requests_answered(nodes[n], session) == {"hot-miss": 5.0}, "its four reads and one copy"
    assert await requests_answered(nodes[order[-1]], session) == {"hot-miss": 4.0}
    assert origin.requests[PATH] == 1


async def test_a_feeder_asked_before_its_own_reads_came_feeds_the_copy_they_make(origin, cluster, session):
    """Three nodes, R = 1: the third node in the key's order reads its copy from the second's. Its reads come
    first, so the second is asked for its copy before any read of its own arrived; it waits for the first of
    them (they come a moment later, as a stampede's do) and feeds the copy they make, rather than answering
    504 and sending the third node to the owner's link for a whole copy of its own."""
    origin.put(PATH, BODY, rate=MiB, headers={"Cache-Control": "max-age=3600", "ETag": '"v1"'})
    nodes, _ = await cluster(3, replicas=1, hot_reads=2)
    owner, feeder, fed = (p.id for p in nodes["n0"].node.cluster.owners(KEY, 3))

    async def late() -> list:
        await asyncio.sleep(0.1)
        return list(await asyncio.gather(*(nodes[feeder].get(session, PATH) for _ in range(2))))

    with capture_logs() as logs:
        results = await asyncio.gather(*(nodes[fed].get(session, PATH) for _ in range(2)), late())
        for node in nodes.values():
            await node.node.settled()
    answers = [*results[:2], *results[2]]
    assert [(status, body == BODY) for status, _, body in answers] == [(200, True)] * 4
    assert sorted(e["source"] for e in logs if e["event"] == "streaming_copy_started") == sorted([owner, feeder]), \
        "the feeder's copy from the owner, the fed node's from the feeder"
    assert not [e for e in logs if e["event"] == "streaming_parent_missed"]
    assert sum((await requests_answered(nodes[owner], session)).values()) == 2, "one answer per head read"
    assert origin.requests[PATH] == 1


async def test_a_copy_request_that_waits_on_a_feeders_head_is_not_counted_among_the_feeders_readers(
        origin, cluster, session, monkeypatch):
    """Three nodes, R = 2, three reads at once through the second owner and three through the third node,
    whose copy streams from the second owner's. The third node's head can have the first owner's answer
    before the second owner's head has it (a loaded machine orders them either way), and then asks the
    second owner for its copy while that head still waits. Held in that order here: the second owner's
    answer is taken only once the third node's request waits on its head. That request is a node asking
    for a copy, not a reader of the second owner: its `streaming_copy_started` counts two readers waiting,
    as in the other order, and the request apart."""
    origin.put(PATH, BODY, rate=MiB, headers={"Cache-Control": "max-age=3600", "ETag": '"v1"'})
    nodes, _ = await cluster(3, replicas=2, hot_reads=3)
    first, second, third = (p.id for p in nodes["n0"].node.cluster.owners(KEY, 3))
    copies = {n: nodes[n].node.handler.relayed.streaming for n in (second, third)}

    def readers_waiting(n: str) -> int:
        head = copies[n]._heads.get(KEY)
        return 0 if head is None else head.waiting

    answer = origin._answer

    async def once_every_reader_waits(request):
        # Every read here before the owner answers: each node's head and its two others.
        await until(lambda: readers_waiting(second) == readers_waiting(third) == 2)
        return await answer(request)

    asked = asyncio.Event()
    for_peer, take = copies[second].for_peer, copies[second].take

    async def asked_for_its_copy(key: str):
        asked.set()
        return await for_peer(key)  # waits on the head at once, before this task yields

    async def taken_once_asked(*args, **kwargs):
        await asked.wait()
        return await take(*args, **kwargs)

    monkeypatch.setattr(origin, "_answer", once_every_reader_waits)
    monkeypatch.setattr(copies[second], "for_peer", asked_for_its_copy)
    monkeypatch.setattr(copies[second], "take", taken_once_asked)
    with capture_logs() as logs:
        results = await asyncio.gather(*(nodes[n].get(session, PATH) for n in (second, third) for _ in range(3)))
        for node in nodes.values():
            await node.node.settled()
    assert [(status, headers["X-Nezha-Cache"], body == BODY) for status, headers, body in results] == \
        [(200, "hot-miss", True)] * 6
    started = sorted((e["source"], e["waiting"], e["peers"]) for e in logs if e["event"] == "streaming_copy_started")
    assert started == sorted([(first, 2, 1), (second, 2, 0)]), "the second owner's copy, then the third's from it"
    assert origin.requests[PATH] == 1
