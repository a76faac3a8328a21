"""Copies first (cachenode/front/copies_first.py): a client reading a fill keeps within LEAD of the slowest
peer reading it, a peer that stood still for STALL is not waited for, and a peer's sends come in PIECEs."""

from __future__ import annotations

import asyncio

from cachenode.front.copies_first import LEAD, PIECE, STALL, Pace, Paced, reader
from tests.support_pace import wait_ends


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FillLike:
    """Any object the readers of one fill share (a fill, in the node)."""


async def test_a_client_with_no_peer_on_the_fill_sends_whatever_has_arrived_and_peers_are_per_fill():
    fill, other = FillLike(), FillLike()
    reader(other, peer=True, offset=0)
    client = reader(fill, peer=False, offset=0)
    assert await client.upto(0, 8 << 20) == 8 << 20
    reader(fill, peer=True, offset=0)
    assert await reader(fill, peer=False, offset=0).upto(0, 8 << 20) == LEAD


async def test_a_client_sends_up_to_lead_past_the_slowest_peer_that_moved_lately():
    clock = Clock()
    pace = Pace(clock=clock)
    slow, fast = Paced(pace, peer=True, offset=0), Paced(pace, peer=True, offset=0)
    slow.sent(PIECE)
    fast.sent(4 * PIECE)
    client = Paced(pace, peer=False, offset=0)
    assert await client.upto(0, 8 << 20) == PIECE + LEAD
    slow.close()  # the slowest one left: the next sets the pace
    assert await client.upto(0, 8 << 20) == 4 * PIECE + LEAD
    clock.now += STALL  # the other stood still since: not waited for
    assert await client.upto(0, 8 << 20) == 8 << 20


async def test_a_client_lead_past_the_peers_waits_until_one_moves():
    pace = Pace()
    peer = Paced(pace, peer=True, offset=0)
    client = Paced(pace, peer=False, offset=LEAD)
    waiting = asyncio.ensure_future(client.upto(LEAD, 8 << 20))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "a whole lead past the peer: it waits"
    peer.sent(PIECE)
    assert await asyncio.wait_for(waiting, 1) == PIECE + LEAD


async def test_a_client_waits_at_most_stall_for_a_peer_that_stands_still(monkeypatch):
    """One wait, ended by its STALL timer running out (no move woke it), and the still peer no longer holds the client."""
    pace = Pace()
    Paced(pace, peer=True, offset=0)
    client = Paced(pace, peer=False, offset=LEAD)
    ended = wait_ends(pace, monkeypatch)
    assert await client.upto(LEAD, 8 << 20) == 8 << 20
    assert ended == [("timer", STALL)]


async def test_a_peer_sends_in_pieces_and_is_never_paced():
    pace = Pace()
    Paced(pace, peer=True, offset=0)
    other = Paced(pace, peer=True, offset=10 * LEAD)
    assert await other.upto(10 * LEAD, 20 * LEAD) == 10 * LEAD + PIECE


def test_a_peers_socket_keeps_at_most_unsent_bytes_unsent_while_it_reads_a_fill_so_its_place_is_what_left():
    import socket

    from cachenode.front.copies_first import UNSENT, unhurried

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        class Transport:
            def get_extra_info(self, name):
                return accepted if name == "socket" else None

        default = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT)
        unhurried(Transport())
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == UNSENT
        unhurried(Transport(), unsent=0)  # the fill is sent: the system's default again
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == default
        unhurried(None)  # a transport already gone: nothing to do
    finally:
        for s in (server, client, accepted):
            s.close()
