"""Several nodes in one process, sharing a ring: relays, failover, replicas, hand-off.

The ring is set directly on each node's view here; propagation through Redis
is tested with real processes in tests/integration/cluster/.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from cachenode.keys import cache_key, parse_target

HOST = "www.cs.toronto.edu"


@dataclass(frozen=True)
class Members:
    epoch: int
    nodes: dict[str, str]
    weights: dict[str, int] = field(default_factory=dict)


def key_of(path: str) -> str:
    return cache_key(parse_target(path, HOST))


@pytest.fixture
def cluster(make_node, tmp_path):
    async def build(n: int, *, replicas: int = 1, **settings):
        nodes = {}
        for i in range(n):
            node = await make_node(data_dir=tmp_path / f"n{i}", node_id=f"n{i}", replicas=replicas, **settings)
            nodes[f"n{i}"] = node
        members = Members(1, {nid: f"127.0.0.1:{nd.server.port}" for nid, nd in nodes.items()})
        for nd in nodes.values():
            nd.node.cluster.update(members)
        return nodes, members

    return build


def owner_and_other(nodes, path, replicas=1):
    anyone = next(iter(nodes.values()))
    owners = [p.id for p in anyone.node.cluster.owners(key_of(path), replicas)]
    others = [nid for nid in nodes if nid not in owners]
    return owners, others


async def test_request_to_non_owner_is_relayed_to_the_owner_once(origin, cluster, session):
    origin.put("/d/a.bin", b"a" * 300_000)
    nodes, _ = await cluster(3)
    owners, others = owner_and_other(nodes, "/d/a.bin")
    status, headers, got = await nodes[others[0]].get(session, "/d/a.bin")
    assert status == 200 and got == b"a" * 300_000
    assert headers["X-Nezha-Served-By"] == owners[0] and headers["X-Nezha-Cache"] == "peer-miss"
    await nodes[owners[0]].node.settled()
    status, headers, got = await nodes[others[1]].get(session, "/d/a.bin")
    assert got == b"a" * 300_000 and headers["X-Nezha-Cache"] == "peer-hit"
    assert origin.requests["/d/a.bin"] == 1
    assert key_of("/d/a.bin") not in nodes[others[0]].node.store  # the relay stores nothing


async def test_range_requests_are_relayed(origin, cluster, session):
    body = bytes(range(256)) * 1000
    origin.put("/d/r.bin", body)
    nodes, _ = await cluster(2)
    owners, others = owner_and_other(nodes, "/d/r.bin")
    await nodes[owners[0]].get(session, "/d/r.bin")
    await nodes[owners[0]].node.settled()
    status, headers, got = await nodes[others[0]].get(session, "/d/r.bin", headers={"Range": "bytes=1000-1999"})
    assert status == 206 and got == body[1000:2000]
    assert headers["Content-Range"] == f"bytes 1000-1999/{len(body)}"


async def test_dead_owner_fails_over_to_next_owner_within_a_second(origin, cluster, session):
    origin.put("/d/f.bin", b"f" * 100_000)
    nodes, members = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, "/d/f.bin", replicas=2)
    await nodes[owners[0]].get(session, "/d/f.bin")
    await asyncio.gather(*(n.node.settled() for n in nodes.values()))
    assert key_of("/d/f.bin") in nodes[owners[1]].node.store, "replica was not copied"
    assert origin.requests["/d/f.bin"] == 1
    await nodes[owners[0]].server.close()
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, headers, got = await nodes[others[0]].get(session, "/d/f.bin")
    assert status == 200 and got == b"f" * 100_000
    assert headers["X-Nezha-Served-By"] == owners[1] and headers["X-Nezha-Cache"] == "peer-hit"
    assert loop.time() - started < 1.0
    assert origin.requests["/d/f.bin"] == 1


async def test_every_owner_down_goes_to_the_origin_directly(origin, cluster, session):
    origin.put("/d/o.bin", b"o" * 1000)
    nodes, _ = await cluster(2)
    owners, others = owner_and_other(nodes, "/d/o.bin")
    await nodes[owners[0]].server.close()
    status, headers, got = await nodes[others[0]].get(session, "/d/o.bin")
    assert status == 200 and got == b"o" * 1000 and headers["X-Nezha-Cache"] == "miss"


async def test_owner_dying_mid_body_is_resumed_from_the_next_owner(origin, cluster, session, aiohttp_server):
    from tests.support_origin import TestOrigin

    nodes, members = await cluster(2, replicas=2)
    entry, real = nodes["n0"], nodes["n1"]
    liar = TestOrigin()  # a fake owner: right headers, then it dies after 100 kB
    liar_server = await aiohttp_server(liar.app(), host="127.0.0.1")
    ring = Members(2, {"liar": f"127.0.0.1:{liar_server.port}", "n1": members.nodes["n1"]})
    entry.node.cluster.update(ring)  # the entry node is not in this ring: it must relay
    real.node.cluster.update(ring)
    path = next(p for p in (f"/d/m{i}.bin" for i in range(100))
                if entry.node.cluster.owners(key_of(p))[0].id == "liar")
    body = bytes(range(256)) * 2000
    origin.put(path, body)
    liar.put(path, body, etag=origin.etags[path], die_after=100_000)
    await real.get(session, path)
    await real.node.settled()
    status, headers, got = await entry.get(session, path)
    assert status == 200 and got == body
    assert liar.requests[path] == 1 and origin.requests[path] == 1
    assert real.node.store.lookup(key_of(path)) is not None


async def test_disagreeing_rings_answer_every_request_within_one_forward(origin, cluster, session):
    for i in range(20):
        origin.put(f"/d/{i}", str(i).encode() * 100)
    nodes, members = await cluster(2)
    a, b = nodes["n0"], nodes["n1"]
    # Each node believes the other owns everything.
    a.node.cluster.update(Members(2, {"n1": members.nodes["n1"]}))
    b.node.cluster.update(Members(2, {"n0": members.nodes["n0"]}))
    for i in range(20):
        status, headers, got = await a.get(session, f"/d/{i}")
        assert status == 200 and got == str(i).encode() * 100
        assert headers["X-Nezha-Served-By"] == "n1"
    assert sum(origin.requests.values()) == 20


async def test_drain_before_removal_leaves_zero_origin_fetches(origin, cluster, session):
    paths = [f"/set/{i}.bin" for i in range(30)]
    for p in paths:
        origin.put(p, p.encode() * 500)
    nodes, members = await cluster(3)
    for p in paths:
        await nodes["n0"].get(session, p)
    await asyncio.gather(*(n.node.settled() for n in nodes.values()))
    assert sum(origin.requests.values()) == 30
    leaving = "n2"
    remaining = {k: v for k, v in members.nodes.items() if k != leaving}
    async with session.post(nodes[leaving].url + "/_nezha/handoff", json={"nodes": remaining, "epoch": 2}) as r:
        assert r.status == 202
    for _ in range(100):
        async with session.get(nodes[leaving].url + "/_nezha/handoff") as r:
            progress = await r.json()
        if progress["state"] == "done":
            break
        await asyncio.sleep(0.05)
    assert progress["state"] == "done" and progress["failed"] == 0
    assert progress["total"] == len(nodes[leaving].node.store)
    await nodes[leaving].server.close()
    for nid in remaining:
        nodes[nid].node.cluster.update(Members(2, remaining))
    for p in paths:
        status, headers, got = await nodes["n0"].get(session, p)
        assert got == p.encode() * 500
    assert sum(origin.requests.values()) == 30


async def test_replicate_refuses_a_source_outside_the_ring(cluster, session):
    nodes, _ = await cluster(2)
    async with session.post(nodes["n0"].url + "/_nezha/replicate",
                            json={"host": HOST, "path": "/x", "source": "intruder"}) as r:
        assert r.status == 400 and "not a member" in await r.text()
    async with session.post(nodes["n0"].url + "/_nezha/replicate", data=b"{not json") as r:
        assert r.status == 400 and "not JSON" in await r.text()


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "copy"])
async def test_large_relays_arrive_whole_and_never_stall(origin, cluster, session, splice):
    """Big enough that aiohttp pauses and resumes the peer socket under the relay."""
    import hashlib
    import os as _os

    body = _os.urandom(24 * 1024 * 1024)
    origin.put("/d/big.bin", body)
    nodes, _ = await cluster(2, origin_read_timeout=2.0)
    owners, others = owner_and_other(nodes, "/d/big.bin")
    await nodes[owners[0]].get(session, "/d/big.bin")
    await nodes[owners[0]].node.settled()
    relay = nodes[others[0]]
    relay.node.relay.splice = splice
    digest = hashlib.sha256(body).hexdigest()
    for _ in range(4):
        status, headers, got = await relay.get(session, "/d/big.bin")
        assert status == 200 and headers["X-Nezha-Cache"] == "peer-hit"
        assert hashlib.sha256(got).hexdigest() == digest
    assert origin.requests["/d/big.bin"] == 1


async def test_with_a_cluster_token_internal_endpoints_refuse_callers_without_it(origin, cluster, session):
    origin.put("/t/x", b"t" * 5000)
    nodes, members = await cluster(2, replicas=2, cluster_token="s3cret")
    for headers, status in (({}, 403), ({"X-Nezha-Token": "nope"}, 403)):
        async with session.post(nodes["n0"].url + "/_nezha/handoff", json={"nodes": members.nodes},
                                headers=headers) as r:
            assert r.status == status and "token" in await r.text()
    # Nodes that share the token still replicate to each other.
    owners, _ = owner_and_other(nodes, "/t/x", replicas=2)
    await nodes[owners[0]].get(session, "/t/x")
    await asyncio.gather(*(n.node.settled() for n in nodes.values()))
    assert all(key_of("/t/x") in n.node.store for n in nodes.values())
    assert origin.requests["/t/x"] == 1
