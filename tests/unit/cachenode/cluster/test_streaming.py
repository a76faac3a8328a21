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
