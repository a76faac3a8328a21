"""A peer is marked down only when a liveness probe confirms it (cachenode/peers/asks.py `PeerAsks.ask`).

One connect that failed (a SYN dropped on a loaded box, a stampede's full accept queue) once marked a live
owner down for five seconds, and a stampede at N = 8 read its chunks from the origin meanwhile. Here the
failure is injected by a test double around the node's real client, so each test names its cause: the first
connect is dropped (as a timed-out connect is reported), and the probe then answers or not.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from cachenode.fill.origin import OriginClient
from cachenode.front.relay import PeerRelay
from cachenode.peers.asks import PeerLate
from nezha.errors import OriginError, OriginTimeout, PoolBusy
from nezha.ring import Peer
from tests.integration.cachenode.conftest import owner_and_other

PEER_TIMEOUT = 0.5
HOST = "www.cs.toronto.edu"


class DroppingClient:
    """The node's client, but the first `drops` requests to each peer that are not a probe fail as a connect
    that timed out would, and every probe fails so too when `probes_fail`. It records the path of each
    request it was given, and how many it dropped."""

    def __init__(self, real: OriginClient, *, drops: int, probes_fail: bool = False) -> None:
        self.real, self.drops, self.probes_fail = real, drops, probes_fail
        self.asked: list[str] = []
        self.dropped: dict[str, int] = {}  # by peer address

    async def request(self, method: str, url: str, **kwargs):
        _, _, address, path = url.split("/", 3)
        path = "/" + path
        self.asked.append(path)
        probe = path == "/healthz"
        if (probe and self.probes_fail) or (not probe and self.dropped.get(address, 0) < self.drops):
            if not probe:
                self.dropped[address] = self.dropped.get(address, 0) + 1
            raise OriginTimeout(f"{kwargs['what']}: no answer within the timeout (a dropped SYN, injected)")
        return await self.real.request(method, url, **kwargs)


def answering() -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=f"answered {request.path}\n")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.fixture
async def client():
    real = OriginClient(connect_timeout=PEER_TIMEOUT, read_timeout=5)
    await real.start()
    yield real
    await real.close()


def relay_over(client) -> PeerRelay:
    return PeerRelay(node_id="n0", client=client, peer_timeout=PEER_TIMEOUT, read_timeout=5, header_timeout=10,
                     read_size=1 << 16)


@pytest.fixture
async def owner(aiohttp_server):
    server = await aiohttp_server(answering(), host="127.0.0.1")
    return Peer("n1", f"127.0.0.1:{server.port}")


async def test_a_peer_whose_first_connect_is_dropped_but_answers_its_probe_stays_up_and_serves(client, owner):
    double = DroppingClient(client, drops=1)
    relay = relay_over(double)
    with capture_logs() as logs:
        r = await relay.ask(owner, "GET", owner.url + "/x", headers={})
    try:
        assert r.status == 200 and await r.text() == "answered /x\n"
    finally:
        r.release()
    assert double.asked == ["/x", "/healthz", "/x"], "probed after the dropped connect, then asked once more"
    assert not relay.is_down(owner)
    assert [e["event"] for e in logs if e["event"].startswith("peer_")] == ["peer_failed_probe_passed"]


async def test_a_peer_that_refuses_and_fails_its_probe_is_marked_down(client):
    with socket.socket() as s:  # a port nothing listens on: every connect to it is refused
        s.bind(("127.0.0.1", 0))
        gone = Peer("n1", f"127.0.0.1:{s.getsockname()[1]}")
    double = DroppingClient(client, drops=0)
    relay = relay_over(double)
    with capture_logs() as logs, pytest.raises(OriginError, match="Errno 111"):
        await relay.ask(gone, "GET", gone.url + "/x", headers={})
    assert double.asked == ["/x", "/healthz"]
    assert relay.is_down(gone)
    [down] = [e for e in logs if e["event"] == "peer_marked_down"]
    assert "cannot connect" in down["reason"] and "liveness probe failed" in down["reason"]


async def test_a_dropped_connect_whose_probe_fails_too_marks_the_peer_down(client, owner):
    double = DroppingClient(client, drops=1, probes_fail=True)
    relay = relay_over(double)
    with pytest.raises(OriginTimeout):
        await relay.ask(owner, "GET", owner.url + "/x", headers={})
    assert double.asked == ["/x", "/healthz"], "not asked again once the probe failed"
    assert relay.is_down(owner)


async def test_a_peer_that_fails_twice_but_passes_both_probes_stays_up_and_is_not_asked_a_third_time(
        client, owner):
    double = DroppingClient(client, drops=2)
    relay = relay_over(double)
    with pytest.raises(OriginTimeout):
        await relay.ask(owner, "GET", owner.url + "/x", headers={})
    assert double.asked == ["/x", "/healthz", "/x", "/healthz"]
    assert not relay.is_down(owner), "alive by its probes: the caller moves on for this request alone"


async def test_a_request_that_is_not_safe_to_repeat_is_not_asked_again(client, owner):
    double = DroppingClient(client, drops=1)
    relay = relay_over(double)
    with pytest.raises(OriginTimeout):
        await relay.ask(owner, "POST", owner.url + "/x", headers={})
    assert double.asked == ["/x", "/healthz"]
    assert not relay.is_down(owner)


async def test_a_peer_that_passes_its_probes_but_sends_no_headers_in_time_is_late_not_down(
        client, aiohttp_server):
    async def hold(request: web.Request) -> web.Response:
        if request.path == "/healthz":
            return web.Response(text="ok\n")
        await never.wait()
        return web.Response()

    never = asyncio.Event()
    app = web.Application()
    app.router.add_get("/{tail:.*}", hold)
    server = await aiohttp_server(app, host="127.0.0.1")
    cold = Peer("n1", f"127.0.0.1:{server.port}")
    relay = PeerRelay(node_id="n0", client=client, peer_timeout=0.05, read_timeout=5, header_timeout=0.1,
                      read_size=1 << 16)
    with pytest.raises(PeerLate):
        await relay.ask(cold, "GET", cold.url + "/x", headers={})
    assert not relay.is_down(cold)


async def test_a_relay_whose_first_connect_to_the_owner_is_dropped_is_served_by_that_owner(
        origin, cluster, session):
    """The owner fills the key: passing it over would have the next owner fetch it from the origin too."""
    origin.put("/d/drop.bin", b"d" * 50_000)
    nodes, _ = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, "/d/drop.bin", replicas=2)
    entry = nodes[others[0]]
    double = DroppingClient(entry.node.relay.client, drops=1)
    entry.node.relay.client = double
    status, headers, got = await entry.get(session, "/d/drop.bin")
    assert status == 200 and got == b"d" * 50_000
    assert headers["X-Nezha-Served-By"] == owners[0]
    assert double.asked == ["/d/drop.bin", "/healthz", "/d/drop.bin"]
    assert not entry.node.relay.is_down(entry.node.cluster.peer(owners[0]))
    assert origin.requests["/d/drop.bin"] == 1


async def test_a_relay_to_an_owner_that_refuses_and_fails_its_probe_fails_over_and_marks_it_down(
        origin, cluster, session):
    origin.put("/d/gone.bin", b"g" * 50_000)
    nodes, members = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, "/d/gone.bin", replicas=2)
    entry = nodes[others[0]]
    await nodes[owners[0]].server.close()
    status, headers, got = await entry.get(session, "/d/gone.bin")
    assert status == 200 and got == b"g" * 50_000 and headers["X-Nezha-Served-By"] == owners[1]
    assert entry.node.relay.is_down(Peer(owners[0], members.nodes[owners[0]]))


async def test_a_probe_that_finds_this_nodes_own_pool_full_marks_no_peer_down(aiohttp_server):
    """The peers are asked through the node's one client pool. When every connection of it is busy (a
    stampede's), a probe that waited for one said nothing of the peer: no verdict, and the peer stays up."""
    release = asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="late\n")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hold)
    busy = await aiohttp_server(app, host="127.0.0.1")
    alive = await aiohttp_server(answering(), host="127.0.0.1")
    peer = Peer("n1", f"127.0.0.1:{alive.port}")
    client = OriginClient(connect_timeout=PEER_TIMEOUT, read_timeout=30, limit=1, pool_timeout=PEER_TIMEOUT)
    await client.start()
    relay = PeerRelay(node_id="n0", client=client, peer_timeout=0.05, read_timeout=5, header_timeout=10,
                      read_size=1 << 16)
    holding = asyncio.ensure_future(client.request("GET", f"http://127.0.0.1:{busy.port}/x", headers={},
                                                   what="the one connection"))
    try:
        await asyncio.sleep(0)  # the one connection is taken
        while not client._session.connector._acquired:  # noqa: SLF001 - until the holder has it
            await asyncio.sleep(0.01)
        with capture_logs() as logs:
            assert await relay.probe(peer) is None, "no verdict on the peer"
            with pytest.raises(PoolBusy):
                await relay.ask(peer, "GET", peer.url + "/x", headers={})
        assert not relay.is_down(peer)
        # The ask waited for the pool until pool_timeout, probing each peer_timeout: no verdict each time.
        assert {e["event"] for e in logs} == {"peer_probe_pool_busy"}
    finally:
        release.set()
        (await holding).release()
        await client.close()


async def test_a_chunked_read_whose_connects_to_chunk_owners_are_dropped_reads_every_chunk_from_its_owner(
        origin, cluster, session):
    """The incident: a stampede's reading node lost a connect to a live chunk owner, marked it down and read
    its chunks from the origin. Here the reading node's first connects to its peers are dropped: each owner
    is probed, found alive and asked again, so none is marked down and the origin is asked nothing more."""
    size, chunk = 16 << 20, 2 << 20
    body = os.urandom(size)
    origin.put("/d/chunked.bin", body, headers={"Accept-Ranges": "bytes", "Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(4, chunk_threshold=8 << 20, chunk_size=chunk)
    first, entry = list(nodes.values())[:2]
    assert (await first.get(session, "/d/chunked.bin"))[2] == body  # every chunk filled on its owner
    for nd in nodes.values():
        await nd.node.settled()
    fetched = origin.requests["/d/chunked.bin"]
    double = DroppingClient(entry.node.relay.client, drops=1)
    entry.node.relay.client = double
    status, _, got = await entry.get(session, "/d/chunked.bin")
    assert status == 200 and got == body
    assert len(double.dropped) >= 2, "it read from several peers (it holds 3 of the 8 chunks at most)"
    assert double.asked.count("/healthz") == len(double.dropped), "each peer's dropped first connect was probed"
    assert not any(entry.node.relay.is_down(entry.node.cluster.peer(n)) for n in nodes if n != entry.node.node_id)
    assert origin.requests["/d/chunked.bin"] == fetched, "no chunk read from the origin"


async def test_a_peer_that_closes_the_first_connection_before_its_headers_is_probed_and_asked_again(client):
    """A real socket, no double: the first two connections are closed once the request is read (a worker
    restarting; the client's own retry on a closed connection, fill/plain_get.py, takes the second), then
    every request is answered: the probe finds the peer alive, and it is asked again."""
    connections = 0
    answered: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first = connections <= 2
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if first:
                    return  # closed with nothing sent
                path = head.split(b" ", 2)[1]
                answered.append(path)
                body = b"answered " + path + b"\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    peer = Peer("n1", f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    relay = relay_over(client)
    try:
        with capture_logs() as logs:
            r = await relay.ask(peer, "GET", peer.url + "/x", headers={})
        try:
            assert r.status == 200 and await r.text() == "answered /x\n"
        finally:
            r.release()
    finally:
        server.close()
        await server.wait_closed()
    assert not relay.is_down(peer)
    [failed] = [e for e in logs if e["event"] == "peer_failed_probe_passed"]
    assert failed["again"] is True and "ServerDisconnected" in failed["error"]
    assert answered == [b"/healthz", b"/x"], "the probe, then the request asked again"
