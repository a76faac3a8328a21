"""Which relayed reads share one stream from the owner, and when an owner's answer becomes this node's copy
(cachenode/cluster/streaming.py)."""

from __future__ import annotations

import dataclasses

import pytest

from cachenode.cluster.streaming import Head, may_share, streams

MiB = 1 << 20


@pytest.mark.parametrize("method, headers, shared", [
    ("GET", {"Host": "h", "User-Agent": "wget"}, True),
    ("HEAD", {}, False),
    ("GET", {"Range": "bytes=0-9"}, False),
    ("GET", {"if-none-match": '"a"'}, False),
    ("GET", {"If-Modified-Since": "Wed, 01 Jan 2025 00:00:00 GMT"}, False),
    ("GET", {"If-Range": '"a"'}, False),
    ("GET", {"Cache-Control": "no-cache"}, False),
    ("GET", {"Pragma": "no-cache"}, False),
])
def test_only_a_plain_get_of_the_whole_object_may_be_answered_by_another_reads_stream(method, headers, shared):
    assert may_share(method, headers) is shared


FILLING = Head(status=200, cache="miss", length=8 * MiB, chunked=False, varies=False, authorize=False, waiting=3,
               replica=False, hot_reads=3, hot_room=100 * MiB, fits=True)


@pytest.mark.parametrize("changes, why", [
    ({}, None),
    ({"cache": "miss-joined"}, None),
    ({"replica": True, "hot_room": 1}, None),  # a replica's copy is no hot copy: the hot share does not bound it
    ({"hot_room": None}, None),
    ({"waiting": 2}, None),  # three reads at once: as many as make a key hot
    ({"waiting": 1}, "2 reads at once, fewer than 3"),
    ({"waiting": 1, "hot_reads": 1}, None),
    ({"waiting": 1, "replica": True}, None),  # a replica keeps a copy anyway
    ({"waiting": 0, "replica": True}, "read alone"),
    ({"waiting": 0, "hot_reads": 1}, "read alone"),  # a key read once is not copied
    ({"waiting": 0}, "read alone"),
    ({"waiting": 1, "peers": 1}, None),  # a copy request of a node this one feeds counts as a read
    ({"waiting": 0, "peers": 1}, "2 reads at once, fewer than 3"),
    ({"cache": "hit"}, "owner answered hit"),
    ({"cache": ""}, "owner answered without X-Nezha-Cache"),
    ({"status": 206}, "answer 206 of length 8388608"),
    ({"length": None}, "answer 200 of length None"),
    ({"chunked": True}, "chunked"),
    ({"varies": True}, "varies"),
    ({"authorize": True}, "authorize"),
    ({"hot_room": MiB}, f"{8 * MiB} bytes exceed the hot share ({MiB})"),
    ({"fits": False}, f"{8 * MiB} bytes do not fit the store"),
])
def test_an_owners_answer_becomes_this_nodes_copy_only_while_the_owner_fills_and_another_read_waits(changes, why):
    assert streams(dataclasses.replace(FILLING, **changes)) == why


@pytest.mark.parametrize("position, owners, fanout, parent", [
    (0, 2, 2, None),  # the first owner fills from the origin
    (1, 2, 2, None),  # the second owner copies from the first, as its relayed reads go
    (2, 2, 2, None),  # the first owner's second child
    (3, 2, 2, 1), (4, 2, 2, 1), (5, 2, 2, 2), (6, 2, 2, 2), (7, 2, 2, 3), (15, 2, 2, 7),
    (1, 1, 2, None), (2, 1, 2, None), (3, 1, 2, 1),
    (2, 1, 1, 1), (9, 2, 1, 8),  # a chain
    (5, 2, 0, None),  # no tree
])
def test_each_node_streams_from_a_node_ahead_of_it_in_a_heap_under_the_first_owner(position, owners, fanout, parent):
    from cachenode.cluster.streaming import feeds_from

    assert feeds_from(position, owners=owners, fanout=fanout) == parent


@pytest.mark.parametrize("n", [2, 4, 8, 16, 17, 64])
def test_no_copy_feeds_more_than_the_fanout_and_every_chain_ends_at_the_first_owner(n):
    """A chain (one copy fed per copy) up to 16 nodes, a heap of degree 2 beyond, whose depth is log2(N)."""
    from collections import Counter

    from cachenode.cluster.streaming import fanout_for, feeds_from

    fanout = fanout_for(n)
    assert fanout == (1 if n <= 16 else 2)
    parents = {p: feeds_from(p, owners=2, fanout=fanout) for p in range(n)}
    fed_by_first = sum(1 for p in range(1, n) if parents[p] is None)
    assert fed_by_first <= fanout
    assert max(Counter(v for v in parents.values() if v is not None).values(), default=0) <= fanout
    for p in range(n):
        hops = 0
        while parents[p] is not None:
            assert parents[p] < p
            p, hops = parents[p], hops + 1
        assert hops <= (max(n - 2, 0) if fanout == 1 else n.bit_length())
