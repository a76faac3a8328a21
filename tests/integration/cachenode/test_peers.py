"""Several nodes in one process, sharing a ring: relays, failover, replicas, hand-off.

The ring is set directly on each node's view here; propagation through Redis
is tested with real processes in tests/integration/cluster/.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from nezha.ring import Peer
from nezha.keys import parse_target
from nezha.ring import Membership
from tests.integration.cachenode.conftest import RangedOrigin, key_of, logged, owner_and_other, until

HOST = "www.cs.toronto.edu"


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


async def test_dead_owner_fails_over_to_next_owner_on_its_refusal_not_a_timeout(origin, cluster, session):
    """A closed port refuses the connect and then the probe, each at once: no timer decides it."""
    origin.put("/d/f.bin", b"f" * 100_000)
    nodes, members = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, "/d/f.bin", replicas=2)
    await nodes[owners[0]].get(session, "/d/f.bin")
    await asyncio.gather(*(n.node.settled() for n in nodes.values()))
    assert key_of("/d/f.bin") in nodes[owners[1]].node.store, "replica was not copied"
    assert origin.requests["/d/f.bin"] == 1
    await nodes[owners[0]].server.close()
    with capture_logs() as logs:
        status, headers, got = await nodes[others[0]].get(session, "/d/f.bin")
    assert status == 200 and got == b"f" * 100_000
    assert headers["X-Nezha-Served-By"] == owners[1] and headers["X-Nezha-Cache"] == "peer-hit"
    [down] = [e for e in logs if e["event"] == "peer_marked_down"]
    assert down["peer"] == owners[0]
    asked, probed = down["reason"].split("; then ")
    assert "cannot connect" in asked and "liveness probe failed" in probed and "cannot connect" in probed
    assert "within" not in down["reason"], "no timeout fired"
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
    ring = Membership(3, {"liar": f"127.0.0.1:{liar_server.port}", "n1": members.nodes["n1"]})
    entry.node.cluster.update(ring)  # the entry node is not in this ring: it must relay
    path = next(p for p in (f"/d/m{i}.bin" for i in range(100))
                if entry.node.cluster.owners(key_of(p))[0].id == "liar")
    body = bytes(range(256)) * 2000
    origin.put(path, body)
    liar.put(path, body, etag=origin.etags[path], die_after=100_000)
    real.node.cluster.update(Membership(2, {"n1": members.nodes["n1"]}))  # alone, n1 fills from the origin
    assert (await real.get(session, path))[2] == body
    await real.node.settled()
    real.node.cluster.update(ring)
    status, headers, got = await entry.get(session, path)
    assert status == 200 and got == body
    # The liar was asked for the object once, then asked why it broke off (peers/cuts.py), which it cannot say.
    asked = [h.get("X-Nezha-Cut") for h in liar.request_headers]
    assert asked == [None, "1"] and origin.requests[path] == 1
    assert entry.node.relay.is_down(Peer("liar", ring.nodes["liar"]))
    assert real.node.store.lookup(key_of(path)) is not None


async def test_disagreeing_rings_answer_every_request_within_one_forward(origin, cluster, session):
    for i in range(20):
        origin.put(f"/d/{i}", str(i).encode() * 100)
    nodes, members = await cluster(2)
    a, b = nodes["n0"], nodes["n1"]
    # Each node believes the other owns everything.
    a.node.cluster.update(Membership(2, {"n1": members.nodes["n1"]}))
    b.node.cluster.update(Membership(2, {"n0": members.nodes["n0"]}))
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
        nodes[nid].node.cluster.update(Membership(2, remaining))
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


async def test_a_client_claiming_to_be_a_peer_is_still_a_client(origin, cluster, session):
    """X-Nezha-Peer without the cluster token: the request asks the key's owner as any client's does,
    instead of each node fetching from the origin itself, and it is counted (issue 14)."""
    origin.put("/t/p.bin", b"p" * 40_000)
    nodes, _ = await cluster(3, replicas=1, cluster_token="s3cret")
    owners, others = owner_and_other(nodes, "/t/p.bin")
    for other in others:
        status, headers, got = await nodes[other].get(session, "/t/p.bin", headers={"X-Nezha-Peer": "nezha-cache-9"})
        assert status == 200 and got == b"p" * 40_000
        assert headers["X-Nezha-Served-By"] == owners[0] and headers["X-Nezha-Cache"].startswith("peer-")
        assert key_of("/t/p.bin") not in nodes[other].node.store
    assert origin.requests["/t/p.bin"] == 1
    # Served to the client with this node's Via, as any client's answer is.
    assert "Via" in headers


def path_owned_by(node, owner: str, prefix: str = "/d/p") -> str:
    """A path whose first owner, in `node`'s ring, is `owner`."""
    return next(p for p in (f"{prefix}{i}.bin" for i in range(1000))
                if node.node.cluster.owners(key_of(p))[0].id == owner)


async def test_concurrent_cold_gets_through_every_node_make_one_origin_get(origin, cluster, session):
    """The replica and the non-owner relay to the first owner; only it asks the origin."""
    body = os.urandom(400_000)
    origin.put("/d/cold.bin", body, delay=0.3)
    nodes, _ = await cluster(3, replicas=2)
    results = await asyncio.gather(*(n.get(session, "/d/cold.bin") for n in nodes.values() for _ in range(2)))
    assert [(status, got == body) for status, _, got in results] == [(200, True)] * 6
    owners, others = owner_and_other(nodes, "/d/cold.bin", replicas=2)
    await nodes[owners[0]].node.settled()  # its replication push waits for the copy
    assert origin.requests["/d/cold.bin"] == 1
    assert all(key_of("/d/cold.bin") in nodes[o].node.store for o in owners)
    assert key_of("/d/cold.bin") not in nodes[others[0]].node.store


async def test_with_the_first_owner_down_the_next_owner_fills_alone(origin, cluster, session):
    body = os.urandom(200_000)
    origin.put("/d/next.bin", body, delay=0.3)
    nodes, _ = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, "/d/next.bin", replicas=2)
    await nodes[owners[0]].server.close()
    entries = [nodes[owners[1]], nodes[others[0]]] * 2
    results = await asyncio.gather(*(n.get(session, "/d/next.bin") for n in entries))
    assert [(status, got == body) for status, _, got in results] == [(200, True)] * 4
    await nodes[owners[1]].node.settled()
    assert origin.requests["/d/next.bin"] == 1
    assert key_of("/d/next.bin") in nodes[owners[1]].node.store


async def test_a_replica_that_relays_an_owners_hit_keeps_a_copy(origin, cluster, session):
    origin.put("/d/keep.bin", b"k" * 50_000)
    nodes, members = await cluster(2, replicas=2)
    owners, _ = owner_and_other(nodes, "/d/keep.bin", replicas=2)
    first, replica = nodes[owners[0]], nodes[owners[1]]
    replica.node.cluster.update(Membership(2, {owners[1]: members.nodes[owners[1]]}))
    first.node.cluster.update(Membership(2, {owners[0]: members.nodes[owners[0]]}))
    await first.get(session, "/d/keep.bin")  # alone in its ring: no replica pushed
    await first.node.settled()
    for nd in nodes.values():
        nd.node.cluster.update(Membership(3, members.nodes))
    status, headers, got = await replica.get(session, "/d/keep.bin")
    assert status == 200 and headers["X-Nezha-Cache"] == "peer-hit" and got == b"k" * 50_000
    await replica.node.settled()
    status, headers, _ = await replica.get(session, "/d/keep.bin")
    assert headers["X-Nezha-Cache"] == "hit"
    assert origin.requests["/d/keep.bin"] == 1


async def test_an_owner_that_takes_connections_and_never_answers_is_given_up_by_its_failed_probe(
        origin, cluster, session, silent_server):
    """peer_timeout (1 s) of silence, then a liveness probe that fails: given up for that (PeerSilent), not
    after `header_timeout` (PeerLate), the many seconds a live owner waiting on its origin is given."""
    nodes, members = await cluster(2, replicas=2)
    entry, real = nodes["n0"], nodes["n1"]
    ring = Membership(2, {"frozen": await silent_server(), "n1": members.nodes["n1"]})
    entry.node.cluster.update(ring)
    real.node.cluster.update(ring)
    path = path_owned_by(entry, "frozen")
    body = os.urandom(100_000)
    origin.put(path, body)
    for via in (entry, real):  # a non-owner, and the replica behind the frozen owner
        with capture_logs() as logs:
            status, headers, got = await via.get(session, path)
        assert status == 200 and got == body
        downs = [e["reason"] for e in logs if e["event"] == "peer_marked_down" and e["peer"] == "frozen"]
        assert all("no response headers after" in why and "did not answer /healthz" in why for why in downs)
        # The entry asks the frozen owner; by then the replica has the object (its fill served the entry).
        assert downs or via is real
    assert origin.requests[path] == 1


async def test_a_cold_owner_waiting_for_a_slow_origin_is_waited_for_not_abandoned(origin, cluster, session):
    """Silence that passes the liveness probe is a cold owner, not a dead one."""
    body = os.urandom(100_000)
    origin.put("/d/slow.bin", body, delay=2.5)
    nodes, _ = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, "/d/slow.bin", replicas=2)
    entry = nodes[others[0]]
    status, headers, got = await entry.get(session, "/d/slow.bin")
    assert status == 200 and got == body
    assert headers["X-Nezha-Served-By"] == owners[0] and headers["X-Nezha-Cache"] == "peer-miss"
    assert origin.requests["/d/slow.bin"] == 1
    assert not entry.node.relay.is_down(entry.node.cluster.peer(owners[0]))


async def test_an_owner_frozen_mid_body_is_cut_off_by_its_failed_probe_and_resumed_from_the_next_owner(
        origin, cluster, session, aiohttp_server):
    nodes, members = await cluster(2, replicas=2)
    entry, real = nodes["n0"], nodes["n1"]
    body = os.urandom(600_000)
    thaw = asyncio.Event()
    etag = '"frozen-1"'
    frozen_server = await aiohttp_server(freezing_owner(body, {"ETag": etag}, sent=100_000, thaw=thaw),
                                         host="127.0.0.1")
    ring = Membership(3, {"frozen": f"127.0.0.1:{frozen_server.port}", "n1": members.nodes["n1"]})
    entry.node.cluster.update(ring)
    path = path_owned_by(entry, "frozen")
    origin.put(path, body, etag=etag)
    real.node.cluster.update(Membership(2, {"n1": members.nodes["n1"]}))  # alone, n1 fills from the origin
    assert (await real.get(session, path))[2] == body
    await real.node.settled()
    real.node.cluster.update(ring)
    try:
        with capture_logs() as logs:
            status, headers, got = await entry.get(session, path)
    finally:
        thaw.set()
    assert status == 200 and got == body and headers["X-Nezha-Served-By"] == "frozen"
    # Cut off by the guard's failed probe (not a read timeout), marked down for it unasked, resumed from n1.
    events = [(e["event"], e["peer"]) for e in logs if e["event"] in ("peer_stalled", "peer_marked_down",
                                                                       "peer_resumed")]
    assert events == [("peer_stalled", "frozen"), ("peer_marked_down", "frozen"), ("peer_resumed", "n1")]
    assert "did not answer /healthz" in next(e["reason"] for e in logs if e["event"] == "peer_stalled")
    assert origin.requests[path] == 1


def freezing_owner(body: bytes, headers: dict[str, str], *, sent: int, thaw: asyncio.Event) -> web.Application:
    """An owner that sends the right headers and `sent` bytes, then nothing until
    `thaw`, and answers no /healthz either: a stopped (SIGSTOP) process."""
    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path != "/healthz":
            resp = web.StreamResponse(headers={**headers, "X-Nezha-Cache": "hit"})
            resp.content_length = len(body)
            await resp.prepare(request)
            await resp.write(body[:sent])
        await thaw.wait()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return app


def dying_owner(body: bytes, headers: dict[str, str], *, die_after: int, label: str = "hit") -> web.Application:
    """An owner that sends the right headers and `die_after` bytes, then its
    connection drops; `label`: its X-Nezha-Cache (a hit, or a fill's miss)."""
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**headers, "X-Nezha-Cache": label})
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[:die_after])
        await asyncio.sleep(0.05)
        request.transport.close()
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return app


VALIDATORS = {
    "strong-etag": ({"ETag": '"v1"'}, '"v1"'),
    "last-modified": ({"Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT"}, "Wed, 01 Jan 2025 00:00:00 GMT"),
    "weak-etag-only": ({"ETag": 'W/"v1"', "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT"}, None),
}


@pytest.mark.parametrize("validator", list(VALIDATORS))
async def test_sole_owner_killed_mid_body_is_resumed_from_the_origin_under_if_range(
        cluster, session, aiohttp_server, validator):
    """R=1: no other owner to resume from. With a safe validator the rest
    comes from the origin; without one the client's connection breaks,
    never a short body that looks complete."""
    from nezha.config import Origin

    headers, if_range = VALIDATORS[validator]
    body = os.urandom(500_000)
    upstream = RangedOrigin(body, headers)
    upstream_server = await aiohttp_server(upstream.app(), host="127.0.0.1")
    dead_server = await aiohttp_server(dying_owner(body, headers, die_after=100_000), host="127.0.0.1")
    nodes, members = await cluster(1, origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{upstream_server.port}")])
    entry = nodes["n0"]
    entry.node.cluster.update(Membership(2, {**members.nodes, "dead": f"127.0.0.1:{dead_server.port}"}))
    path = path_owned_by(entry, "dead")
    if if_range is None:
        with pytest.raises(aiohttp.ClientPayloadError):
            await entry.get(session, path)
        assert all("Range" not in h for h in upstream.seen)
        return
    status, got_headers, got = await entry.get(session, path)
    assert status == 200 and got == body and got_headers["X-Nezha-Served-By"] == "dead"
    assert [(h.get("Range"), h.get("If-Range")) for h in upstream.seen] == [
        (f"bytes=100000-{len(body) - 1}", if_range)]
    assert "X-Nezha-Peer" not in upstream.seen[0]


@pytest.mark.parametrize("failure", ["origin-503", "origin-timeout"])
async def test_an_origin_failure_passed_on_by_the_owner_reaches_the_client_without_trying_other_owners(
        origin, cluster, session, failure):
    if failure == "origin-503":
        origin.put("/d/err.bin", b"busy\n", status=503)
    else:
        origin.put("/d/err.bin", b"late", delay=1.5)
    nodes, _ = await cluster(3, replicas=2, origin_read_timeout=0.5)
    owners, others = owner_and_other(nodes, "/d/err.bin", replicas=2)
    entry = nodes[others[0]]
    status, headers, _ = await entry.get(session, "/d/err.bin")
    assert status == (503 if failure == "origin-503" else 504)
    assert headers["X-Nezha-Served-By"] == owners[0]
    assert origin.requests["/d/err.bin"] == 1
    assert not any(entry.node.relay.is_down(entry.node.cluster.peer(o)) for o in owners)


@pytest.mark.parametrize("silence", ["before-headers", "mid-body"])
async def test_a_copy_from_a_source_that_stops_answering_is_given_up_by_its_failed_probe(
        cluster, session, silent_server, aiohttp_server, silence):
    """Before the headers is what a copy meets when its source is shutting down:
    aiohttp drops a request on a connection it accepted while closing, and
    answers nothing. Mid-body is a source that froze. Either way the liveness probe gives it up (not the
    read timeout a copy from a live but slow source is given)."""
    thaw = asyncio.Event()
    if silence == "before-headers":
        source = await silent_server()
    else:
        app = freezing_owner(os.urandom(500_000), {"ETag": '"c1"'}, sent=100_000, thaw=thaw)
        source = f"127.0.0.1:{(await aiohttp_server(app, host='127.0.0.1')).port}"
    nodes, members = await cluster(1)
    copier = nodes["n0"]
    copier.node.cluster.update(Membership(2, {**members.nodes, "n1": source}))
    try:
        with capture_logs() as logs:
            async with session.post(copier.url + "/_nezha/replicate",
                                    json={"host": HOST, "path": "/d/x.bin", "source": "n1"}) as r:
                assert r.status == 200
                lines = [json.loads(line) for line in (await r.text()).splitlines()]
    finally:
        thaw.set()
    assert lines[-1]["result"].startswith("failed")
    if silence == "before-headers":
        [why] = [e["reason"] for e in logs if e["event"] == "peer_marked_down" and e["peer"] == "n1"]
        assert "no response headers after" in why and "did not answer /healthz" in why
    else:
        [stalled] = [e for e in logs if e["event"] == "peer_stalled"]
        assert stalled["peer"] == "n1" and "did not answer /healthz" in stalled["reason"]
    assert key_of("/d/x.bin") not in copier.node.store


async def test_a_copy_that_outlasts_the_read_timeout_is_reported_copied(cluster, aiohttp_server):
    """The replicate call reports progress while it copies, so its length is no failure."""
    from tests.support_origin import TestOrigin

    body = os.urandom(600_000)
    slow = TestOrigin()  # plays the asking node's disk, at 200 kB/s: three seconds of copying
    slow.put("/d/long.bin", body, rate=200_000)
    slow_server = await aiohttp_server(slow.app(), host="127.0.0.1")
    nodes, members = await cluster(2, origin_read_timeout=1.0)
    copier, asker = nodes["n0"], nodes["n1"]
    copier.node.cluster.update(Membership(2, {"n0": members.nodes["n0"], "n1": f"127.0.0.1:{slow_server.port}"}))
    result = await asker.node.replicas.ask_to_copy(Peer("n0", members.nodes["n0"]), parse_target("/d/long.bin", HOST))
    assert result == "copied"
    assert copier.node.store.lookup(key_of("/d/long.bin")).size == len(body)


async def test_a_drain_reports_bytes_and_skips_stale_objects_instead_of_failing(origin, cluster, session):
    """Copies are of fresh objects only; a stale one is no lost data and must not block a removal."""
    origin.put("/h/fresh.bin", b"f" * 300_000)
    origin.put("/h/stale.bin", b"s" * 1000, headers={"Cache-Control": "max-age=1"})
    nodes, members = await cluster(2)
    leaving, staying = nodes["n1"], nodes["n0"]
    leaving.node.cluster.update(Membership(2, {"n1": members.nodes["n1"]}))  # it alone fills both
    for p in ("/h/fresh.bin", "/h/stale.bin"):
        await leaving.get(session, p)
    await leaving.node.settled()
    await asyncio.sleep(1.2)
    async with session.post(leaving.url + "/_nezha/handoff", json={"nodes": {"n0": members.nodes["n0"]}}) as r:
        assert r.status == 202
    for _ in range(100):
        async with session.get(leaving.url + "/_nezha/handoff") as r:
            progress = await r.json()
        if progress["state"] == "done":
            break
        await asyncio.sleep(0.05)
    assert progress["state"] == "done"
    assert (progress["copied"], progress["skipped"], progress["failed"], progress["bytes"]) == (1, 1, 0, 300_000)
    assert key_of("/h/fresh.bin") in staying.node.store


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "copy"])
async def test_a_client_hanging_up_mid_relay_blames_no_owner_and_costs_no_origin_fetch(origin, cluster, session,
                                                                                       splice):
    """The client went away, not the owner: no owner is marked down, nothing is resumed from anywhere."""
    from structlog.testing import capture_logs

    body = os.urandom(64 << 20)  # more than the kernel buffers take, so the relay is mid-body
    origin.put("/d/hangup.bin", body)
    nodes, _ = await cluster(2)
    owners, others = owner_and_other(nodes, "/d/hangup.bin")
    await nodes[owners[0]].get(session, "/d/hangup.bin")
    await nodes[owners[0]].node.settled()
    relay = nodes[others[0]]
    relay.node.relay.splice = splice
    with capture_logs() as logs:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.server.port)
        writer.write(f"GET /d/hangup.bin HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        await reader.readexactly(1 << 20)
        writer.transport.abort()
        await until(logged(logs, "client_gone", "relay_broken"))
        await asyncio.sleep(0.2)  # room for a wrong peer_marked_down or origin resume to show
    events = [e["event"] for e in logs]
    assert "client_gone" in events
    assert "peer_marked_down" not in events and "relay_broken" not in events
    assert not any(e["event"].startswith("origin_resume") for e in logs)
    assert origin.requests["/d/hangup.bin"] == 1
    assert not relay.node.relay.is_down(next(p for p in relay.node.cluster.owners(key_of("/d/hangup.bin"))))
