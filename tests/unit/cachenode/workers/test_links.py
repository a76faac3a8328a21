"""The records between a node's workers: the index as the primary sends it, and a
client connection handed over with its descriptor."""

from __future__ import annotations

import asyncio
import os
import socket

from cachenode.store.objects import Meta
import pytest

from cachenode.workers.channel import MAX_RECORD, Channel
from cachenode.workers.messages import (Conn, Drop, Fallback, Flush, Flushed, Follower, Hits, More, Put, Ready, Synced,
                                        TlsOutcome, Unknown, decode, encode)
from cachenode.workers.follower import meta_from
from cachenode.workers.primary import meta_records


def meta(i: int, header_bytes: int = 10) -> Meta:
    return Meta(key=f"http://h/{i}", url=f"http://h/{i}", host="h", size=i, headers=[("X-Pad", "p" * header_bytes)],
                stored_at=1.0, expires_at=2.0, data=f"{i:064x}.aa.data")


def test_the_index_goes_in_records_below_the_size_a_link_carries_and_comes_back_equal():
    metas = [meta(i, 900) for i in range(300)]
    records = meta_records(metas, "put")
    assert len(records) > 1
    assert all(len(encode(r)) <= MAX_RECORD for r in records)
    back = [meta_from(raw) for r in records for raw in r.metas]
    assert [m.key for m in back] == [m.key for m in metas]
    assert [tuple(h) for h in back[7].headers] == [tuple(h) for h in metas[7].headers]
    assert back[7].expires_at == metas[7].expires_at and back[7].data == metas[7].data


def test_a_meta_too_large_for_any_record_is_sent_as_a_drop_so_followers_hand_its_reads_over():
    records = meta_records([meta(1, MAX_RECORD)], "put")
    assert [type(r) for r in records] == [Drop]
    assert records[0].metas[0]["key"] == "http://h/1"


async def test_a_connection_and_the_bytes_read_of_it_arrive_together_in_order():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    got: list = []
    arrived = asyncio.Event()

    def on_record(head, tail, fds):
        got.append((head, tail, fds))
        if len(got) == 3:
            arrived.set()

    sender = Channel(a, on_record=lambda *_: None, on_closed=lambda: None)
    receiver = Channel(b, on_record=on_record, on_closed=lambda: None)
    client, server = socket.socketpair()
    sender.send(Conn(more=1), b"GET / HTTP/1.1\r\n", fds=(os.dup(server.fileno()),))
    sender.send(More(), b"Host: h\r\n\r\n")
    sender.send(Hits(hits=[["h", "k", "k", False, 10, 0.001]]))
    await asyncio.wait_for(arrived.wait(), 10)
    (h1, t1, fds1), (h2, t2, fds2), (h3, _, fds3) = got
    assert h1 == Conn(more=1) and t1 == b"GET / HTTP/1.1\r\n" and len(fds1) == 1
    assert h2 == More() and t2 == b"Host: h\r\n\r\n" and fds2 == []
    assert h3.hits[0][4] == 10 and fds3 == []
    # The descriptor is the same connection: what the client sends reaches it.
    handed = socket.socket(fileno=fds1[0])
    client.sendall(b"ping")
    assert handed.recv(4) == b"ping"
    for s in (handed, client, server):
        s.close()
    sender.close()
    receiver.close()


async def test_a_link_whose_other_side_is_gone_says_so_once():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    closed = asyncio.Event()
    calls = []

    def gone():
        calls.append(1)
        closed.set()

    Channel(a, on_record=lambda *_: None, on_closed=gone)
    b.close()
    await asyncio.wait_for(closed.wait(), 10)
    await asyncio.sleep(0)
    assert calls == [1]


async def test_a_link_whose_other_side_reads_nothing_is_closed_rather_than_queued_without_bound(monkeypatch):
    from cachenode.workers import channel

    monkeypatch.setattr(channel, "MAX_QUEUED", 50)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.setblocking(False)  # never read
    closed = asyncio.Event()
    link = Channel(a, on_record=lambda *_: None, on_closed=closed.set)
    for _ in range(10_000):
        link.send(Put(), b"x" * 30_000)
        if link.closed:
            break
    assert link.closed and closed.is_set()
    b.close()


@pytest.mark.parametrize("message", [
    Follower(worker=3), Ready(worker=0), Ready(), Put(metas=[{"key": "k"}]), Drop(metas=[]), Synced(), Flush(n=7),
    Flushed(n=7), Conn(eof=True, more=2, secure=True), More(), Hits(hits=[["h", "k", "s", True, 5, None]]),
    TlsOutcome(outcome="terminated"), Fallback(reason="parent_unreachable"),
])
def test_every_message_comes_back_from_its_record_equal_with_its_tail(message):
    assert decode(encode(message, b"tail")) == (message, b"tail")


def test_a_record_of_a_tag_this_version_does_not_know_decodes_as_unknown_for_the_receiver_to_log():
    raw = b'{"t":"newer","x":1}'
    assert decode(len(raw).to_bytes(4, "big") + raw) == (Unknown("newer"), b"")


@pytest.mark.parametrize("record", [b"", b"\x00\x00\x00\x05{bad}", b'\x00\x00\x00\x02[]',
                                    b'\x00\x00\x00\x14{"t":"flush","m":1}  ', b'\x00\x00\x00\x0b{"t":"tls"}'])
def test_a_record_that_is_no_message_is_a_value_error(record):
    with pytest.raises(ValueError):
        decode(record)
