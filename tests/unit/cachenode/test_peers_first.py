"""A node's clients of a chunked object keep within LEAD of the slowest peer reading its chunks from there,
by offsets in the object (cachenode/chunks/peers_first.py); a peer that stands still is not waited for long."""

from __future__ import annotations

import asyncio

from cachenode.chunks.peers_first import PIECE, PeersFirst
from cachenode.fill.pace import LEAD, STALL
from tests.support_pace import wait_ends

MiB = 1 << 20
KEY = "http://h/x"


async def test_a_client_with_no_peer_reading_the_object_sends_everything_at_once():
    client = PeersFirst().sender(KEY, base=2 * MiB, at=0, peer=False)
    assert await client.upto(0, MiB) == MiB


async def test_a_peer_is_sent_a_piece_at_a_time_so_its_place_moves_often():
    peer = PeersFirst().sender(KEY, base=0, at=0, peer=True)
    assert await peer.upto(0, MiB) == PIECE


async def test_a_client_ahead_of_a_peer_reading_an_earlier_chunk_waits_until_the_peer_moves():
    first = PeersFirst()
    peer = first.sender(KEY, base=0, at=0, peer=True)  # another node reading chunk 0 from here
    client = first.sender(KEY, base=MiB, at=0, peer=False)  # a client here at chunk 1
    waiting = asyncio.ensure_future(client.upto(0, MiB))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "the client is past the peer by more than LEAD: it waits"
    peer.sent(MiB)  # the peer has all of chunk 0
    assert await asyncio.wait_for(waiting, 1.0) == LEAD, "then it may go LEAD past the peer"


async def test_a_client_behind_every_peer_is_not_held():
    first = PeersFirst()
    with first.sender(KEY, base=4 * MiB, at=0, peer=True):
        client = first.sender(KEY, base=MiB, at=0, peer=False)
        assert await client.upto(0, MiB) == MiB


async def test_a_peer_that_stands_still_holds_a_client_at_most_stall(monkeypatch):
    """One wait, ended by its STALL timer running out (no move woke it), and the still peer no longer holds the client."""
    first = PeersFirst()
    with first.sender(KEY, base=0, at=0, peer=True):
        client = first.sender(KEY, base=MiB, at=0, peer=False)
        ended = wait_ends(first._paces[KEY], monkeypatch)
        assert await client.upto(0, MiB) == MiB
        assert ended == [("timer", STALL)]


async def test_a_peer_that_is_done_holds_no_one_and_other_objects_are_never_held():
    first = PeersFirst()
    peer = first.sender(KEY, base=0, at=0, peer=True)
    other = first.sender("http://h/y", base=MiB, at=0, peer=False)
    assert await other.upto(0, MiB) == MiB
    peer.close()
    client = first.sender(KEY, base=MiB, at=0, peer=False)
    assert await client.upto(0, MiB) == MiB
