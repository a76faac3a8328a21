"""An owner's link saturated by a stampede drops the SYN of a new connection to it; the kernel sends it again a
second later. An owner that answered moments ago is given that second (cachenode/peers/asks.py
`connect_budget`) instead of its connect failing after `peer_timeout`, which had a stampede read its chunks from
the origin (docs/benchmarks.md, "Stampede"). An owner never heard from gets `peer_timeout`; its connect failing
then is probed, and the owner asked once more, rather than marked down (test_peer_down_by_probe.py).

The dropped SYN is real: a listening socket whose accept queue is full (backlog 0, one connection waiting)
drops every new SYN (Linux, tcp_abort_on_overflow = 0) until the queue is drained, here 0.3 s later, so the
connect completes only with the SYN sent again after the initial RTO of 1 s.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from cachenode.fill.origin import OriginClient
from cachenode.front.relay import PeerRelay
from nezha.ring import Peer

PEER_TIMEOUT = 0.5


async def hello(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def app() -> web.Application:
    a = web.Application()
    a.router.add_get("/{tail:.*}", hello)
    return a


@pytest.fixture
async def relay():
    client = OriginClient(connect_timeout=PEER_TIMEOUT, read_timeout=5)
    await client.start()
    yield PeerRelay(node_id="n0", client=client, peer_timeout=PEER_TIMEOUT, read_timeout=5, header_timeout=10,
                    read_size=1 << 16)
    await client.close()


@pytest.fixture
async def running():
    """An owner that answers at once: where the peer was last heard from."""
    runner = web.AppRunner(app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.fixture
async def saturated():
    """An owner whose listening socket drops SYNs for 0.3 s: its accept queue (backlog 0) holds one
    connection nobody accepted; then the owner starts accepting and answering."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    sock.setblocking(False)
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    waiting = socket.create_connection(sock.getsockname())  # fills the queue
    runner = web.AppRunner(app())
    await runner.setup()

    async def open_later() -> None:
        await asyncio.sleep(0.3)
        await web.SockSite(runner, sock).start()

    opening = asyncio.ensure_future(open_later())
    yield address
    await opening
    waiting.close()
    await runner.cleanup()


async def ask(relay: PeerRelay, peer: Peer) -> float:
    started = time.monotonic()
    r = await relay.ask(peer, "GET", peer.url + "/x", headers={})
    try:
        assert r.status == 200
    finally:
        r.release()
    return time.monotonic() - started


async def test_an_owner_that_answered_recently_is_waited_for_past_a_dropped_syn(relay, running, saturated):
    await ask(relay, Peer("n1", running))
    assert relay.connect_budget(Peer("n1", saturated)) > PEER_TIMEOUT
    with capture_logs() as logs:
        took = await ask(relay, Peer("n1", saturated))
    assert took > PEER_TIMEOUT, "the connect waited for the SYN sent again"
    assert not [e for e in logs if e["event"] == "peer_failed_probe_passed"], "one connect, not a failed one and a retry"
    assert not relay.is_down(Peer("n1", saturated))


async def test_an_owner_never_heard_from_has_its_connect_given_up_after_peer_timeout_then_probed(relay, saturated):
    """Its dropped SYN would be sent again only after 1 s: the connect fails at `peer_timeout` (0.5 s), by
    which time the owner accepts again, so the probe finds it alive and it is asked once more, not marked down."""
    assert relay.connect_budget(Peer("n1", saturated)) == PEER_TIMEOUT
    with capture_logs() as logs:
        await ask(relay, Peer("n1", saturated))
    [failed] = [e for e in logs if e["event"] == "peer_failed_probe_passed"]
    assert "no answer within the timeout" in failed["error"]
    assert not relay.is_down(Peer("n1", saturated))


async def test_an_owner_marked_down_is_given_only_peer_timeout_again(relay, running):
    await ask(relay, Peer("n1", running))
    relay.mark_down(Peer("n1", running), "a test")
    assert relay.connect_budget(Peer("n1", running)) == PEER_TIMEOUT
