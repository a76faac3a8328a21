"""The chunk layout of a large object: which bytes each chunk holds, which
chunks a read needs, chunk keys that no URL can name, and owners spread by
the ring."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nezha.chunks import Layout, Manifest, Piece, chunk_key, chunk_of, chunks_on, place
from nezha.keys import key_for, parse_target
from nezha.ring import Ring

MiB = 1 << 20


@pytest.mark.parametrize(("size", "chunk", "count", "last"), [
    (64 * MiB, 4 * MiB, 16, (60 * MiB, 64 * MiB - 1)),
    (64 * MiB + 1, 4 * MiB, 17, (64 * MiB, 64 * MiB)),  # one byte past a boundary: a one-byte last chunk
    (1 << 30, 32 * MiB, 32, ((1 << 30) - 32 * MiB, (1 << 30) - 1)),
    (10, 3, 4, (9, 9)),
])
def test_layout_counts_chunks_and_the_last_one_is_short(size, chunk, count, last):
    layout = Layout(size=size, chunk_size=chunk)
    assert layout.count == count
    assert layout.span(count - 1) == last
    assert layout.span(0) == (0, min(chunk, size) - 1)


def test_a_chunk_past_the_end_does_not_exist():
    with pytest.raises(IndexError):
        Layout(size=10, chunk_size=3).span(4)


@pytest.mark.parametrize(("start", "length", "pieces"), [
    (0, 10, [Piece(0, 0, 3), Piece(1, 0, 3), Piece(2, 0, 3), Piece(3, 0, 1)]),
    (4, 1, [Piece(1, 1, 1)]),                       # inside one chunk
    (2, 5, [Piece(0, 2, 1), Piece(1, 0, 3), Piece(2, 0, 1)]),  # across three
    (3, 3, [Piece(1, 0, 3)]),                       # exactly one chunk
    (9, 1, [Piece(3, 0, 1)]),                       # the last byte
    (5, 0, []),
])
def test_a_read_needs_only_the_chunks_its_bytes_lie_in(start, length, pieces):
    assert Layout(size=10, chunk_size=3).pieces(start, length) == pieces


def test_a_read_outside_the_object_is_refused():
    with pytest.raises(ValueError):
        Layout(size=10, chunk_size=3).pieces(8, 3)


@given(size=st.integers(1, 10_000), chunk=st.integers(1, 3_000), data=st.data())
def test_pieces_cover_a_range_exactly_once_in_order(size, chunk, data):
    layout = Layout(size=size, chunk_size=chunk)
    start = data.draw(st.integers(0, size - 1))
    length = data.draw(st.integers(1, size - start))
    covered = []
    for p in layout.pieces(start, length):
        first, last = layout.span(p.index)
        assert 0 < p.length and p.offset + p.length <= last - first + 1
        covered.extend(range(first + p.offset, first + p.offset + p.length))
    assert covered == list(range(start, start + length))


def test_chunk_key_round_trips_and_names_the_chunk_size():
    key = "http://images.cocodataset.org/zips/train2017.zip"
    assert chunk_of(chunk_key(key, 7, 64 * MiB)) == (key, 64 * MiB, 7)
    assert chunk_key(key, 7, 64 * MiB) != chunk_key(key, 7, 32 * MiB)
    assert chunk_of(key) is None


@pytest.mark.parametrize("raw", ["/a#chunk/4/1", "/a%23chunk/4/1", "http://h.example/a#chunk/4/1", "/a?x=#chunk/4/1"])
def test_no_url_a_client_sends_has_a_chunk_key(raw):
    """A fragment never reaches a key and an encoded # stays encoded: a client cannot name a chunk."""
    key = key_for(parse_target(raw, "h.example"), None)
    assert chunk_of(key) is None


def test_chunking_is_off_at_threshold_zero_and_on_at_the_threshold():
    assert not chunks_on(0, 1 << 40)
    assert not chunks_on(100, 99)
    assert chunks_on(100, 100)
    assert not chunks_on(100, None)


KEYS = [f"http://www.cs.toronto.edu/datasets/obj-{k}.bin" for k in range(300)]
FOUR = Ring({f"node-{i}": 1 for i in range(4)})


def shares(table: list[list[str]]) -> Counter:
    return Counter(n for owners in table for n in owners)


def test_the_ring_alone_would_give_one_node_more_than_40_percent_of_many_objects():
    """Why `place` bounds loads: 32 chunks hashed onto four nodes overload one of them too often."""
    over = sum(max(Counter(FOUR.owners(chunk_key(k, i, 32 * MiB), 1)[0] for i in range(32)).values()) > 0.4 * 32
               for k in KEYS)
    assert over > len(KEYS) // 10


@pytest.mark.parametrize(("count", "replicas"), [(32, 1), (16, 1), (32, 2), (5, 1)])
def test_no_node_owns_more_than_its_bounded_share_of_any_object(count, replicas):
    layout = Layout(size=count * 32 * MiB, chunk_size=32 * MiB)
    cap = math.ceil(1.25 * count * replicas / 4)
    for key in KEYS:
        table = place(FOUR, key, layout, replicas)
        assert all(len(set(owners)) == replicas for owners in table)
        assert max(shares(table).values()) <= cap
        if count >= 16 and replicas == 1:
            assert max(shares(table).values()) <= 0.4 * count


@pytest.mark.parametrize(("nodes", "count", "replicas"), [(4, 32, 1), (4, 8, 2), (8, 8, 2), (3, 8, 2), (5, 32, 2)])
def test_no_node_leads_more_than_an_even_share_of_an_objects_chunks(nodes, count, replicas):
    """The first owner fills its chunk and starts every copy of it: its link carries the most, so a
    node leads at most ceil(chunks / nodes) of one object's chunks (the ring alone gave one node of
    eight 3 of 8, and one of four 4 of 8, in bench/stampede.py)."""
    ring = Ring({f"node-{i}": 1 for i in range(nodes)})
    layout = Layout(size=count * MiB, chunk_size=MiB)
    for key in KEYS:
        table = place(ring, key, layout, replicas)
        assert max(Counter(owners[0] for owners in table).values()) <= math.ceil(count / nodes)
        assert all(len(set(owners)) == replicas for owners in table)


def test_placement_starts_from_the_ring_owner_of_each_chunk_key():
    layout = Layout(size=32 * 32 * MiB, chunk_size=32 * MiB)
    key = KEYS[0]
    table = place(FOUR, key, layout, 1)
    same = sum(table[i] == FOUR.owners(chunk_key(key, i, layout.chunk_size), 1) for i in range(layout.count))
    assert same >= layout.count * 0.7, "most chunks sit where the ring puts them; only the overload moves on"


def test_a_fifth_node_moves_about_a_fifth_of_the_chunks():
    five = Ring({f"node-{i}": 1 for i in range(5)})
    layout = Layout(size=32 * 32 * MiB, chunk_size=32 * MiB)
    moved = sum(a != b for key in KEYS for a, b in zip(place(FOUR, key, layout, 1), place(five, key, layout, 1)))
    assert moved / (len(KEYS) * layout.count) < 0.3


def test_every_node_computes_the_same_table_and_an_empty_ring_none():
    layout = Layout(size=10 * MiB, chunk_size=MiB)
    again = Ring({f"node-{i}": 1 for i in reversed(range(4))})
    assert place(FOUR, KEYS[1], layout, 2) == place(again, KEYS[1], layout, 2)
    assert place(Ring({}), KEYS[1], layout, 1) == [[]] * 10


@given(st.integers(1, 1 << 40), st.integers(0, 1 << 50))
def test_a_manifest_decodes_to_what_was_encoded(chunk_size, length):
    manifest = Manifest(chunk_size=chunk_size, length=length)
    assert Manifest.decode(manifest.encode()) == manifest
    assert manifest.layout == Layout(size=length, chunk_size=chunk_size)


def test_a_manifest_is_what_an_owner_has_always_sent():
    """The header's shape is a wire contract between nodes of different versions during a rollout."""
    assert Manifest(chunk_size=4 * MiB, length=64 * MiB).encode() == '{"chunk_size": 4194304, "length": 67108864}'


@pytest.mark.parametrize("value, why", [
    ("not json", "unreadable: JSONDecodeError"),
    ('{"chunk_size": 4}', "unreadable: KeyError: 'length'"),
    ('{"chunk_size": "four", "length": 8}', "unreadable: ValueError"),
    ('[1, 2]', "unreadable: TypeError"),
    ('{"chunk_size": 0, "length": 8}', "no manifest for 8 bytes in chunks of 0"),
    ('{"chunk_size": 4, "length": -1}', "no manifest for -1 bytes in chunks of 4"),
])
def test_a_manifest_that_cannot_be_read_is_refused_naming_why(value, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")) as caught:
        Manifest.decode(value)
    assert value[:20] in str(caught.value)
