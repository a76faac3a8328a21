"""A cold fill's first request as the first chunk's range (cachenode/fill/chunking.py): when it is asked,
and which answers to it start a fill from it."""

from __future__ import annotations

import pytest

from cachenode.fill.chunking import FIRST_CHUNK_UP_TO, first_chunk_range, first_chunk_span
from cachenode.fill.flights import Source
from cachenode.fill.lead import Resume
from nezha.config import Origin
from nezha.ring import Peer

MiB = 1 << 20
ORIGIN = Origin(host="example.org", upstream="http://127.0.0.1:1")
COLD = Source(url="http://example.org/big", what="origin", headers={})
CHUNKING = (8 * MiB, MiB)


def test_a_cold_whole_read_from_an_origin_chunking_modest_objects_asks_for_the_first_chunk():
    assert first_chunk_range(COLD, None, ORIGIN, chunking=CHUNKING, spread=True) == f"bytes=0-{MiB - 1}"


@pytest.mark.parametrize("threshold", [0, FIRST_CHUNK_UP_TO + 1, 2**30], ids=["off", "just-above", "default"])
def test_an_origin_chunking_only_large_objects_or_none_is_asked_with_a_plain_get(threshold):
    assert first_chunk_range(COLD, None, ORIGIN, chunking=(threshold, 64 * MiB), spread=True) is None


@pytest.mark.parametrize("source, spread", [
    (COLD, False),
    (Source(url=COLD.url, what="peer", headers={}, peer=Peer("n1", "127.0.0.1:2")), True),
    (Source(url=COLD.url, what="origin", headers={}, ranged=True), True),
    (Source(url=COLD.url, what="origin", headers={"range": "bytes=5-9"}), True),
    (Source(url=COLD.url, what="origin", headers={}, resume=Resume(first=5, last=None, if_range='"e"')), True),
], ids=["a-node-alone", "a-peer", "a-ranged-read", "the-callers-own-range", "a-resume"])
def test_a_fill_that_is_not_a_cold_whole_read_across_a_ring_is_asked_as_it_was(source, spread):
    assert first_chunk_range(source, None, ORIGIN, chunking=CHUNKING, spread=spread) is None


def test_a_signed_origin_is_asked_as_its_caller_signed():
    signed = Origin(host="example.org", upstream="http://127.0.0.1:1", credentials="authorize")
    assert first_chunk_range(COLD, None, signed, chunking=CHUNKING, spread=True) is None


ASKED = f"bytes=0-{MiB - 1}"


@pytest.mark.parametrize("status, headers, span", [
    (206, {"Content-Range": f"bytes 0-{MiB - 1}/{9 * MiB}", "ETag": '"v1"'}, (0, MiB, 9 * MiB)),
    (206, {"Content-Range": "bytes 0-99/100", "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT"}, (0, 100, 100)),
    (200, {"ETag": '"v1"'}, None),  # an origin that ignores Range: the whole object
    (206, {"Content-Range": f"bytes 5-{MiB - 1}/{9 * MiB}", "ETag": '"v1"'}, None),  # other bytes
    (206, {"Content-Range": f"bytes 0-{MiB - 1}/{9 * MiB}", "ETag": 'W/"v1"'}, None),  # weak: nothing to pin
    (206, {"Content-Range": f"bytes 0-{MiB - 1}/{9 * MiB}"}, None),  # no validator
    (206, {"Content-Range": f"bytes 0-{MiB - 1}/{9 * MiB}", "ETag": '"v1"', "Vary": "Accept"}, None),
    (416, {"Content-Range": "bytes */0"}, None),  # an empty object
], ids=["chunk-0", "a-small-object-whole", "a-200", "other-bytes", "weak-etag", "no-validator", "varying", "416"])
def test_the_answers_a_fill_starts_from_are_the_first_chunks_exactly_of_a_pinned_version(status, headers, span):
    assert first_chunk_span(ASKED, status, headers) == span
