"""Which 206 answers are kept as parts of an object, and which bytes are held (cachenode/http/partial.py)."""

import pytest

from cachenode.http.partial import Extents, Part, part_of

ETAG = '"5d41402abc4b2a76b9719d911017c592"'


def test_a_206_of_one_range_of_a_known_length_under_a_strong_etag_is_a_part():
    headers = {"Content-Range": "bytes 8388608-16777215/20971520", "ETag": ETAG,
               "Cache-Control": "private, max-age=0"}
    assert part_of(206, headers, {}) == Part(first=8388608, end=16777216, total=20971520, etag=ETAG)


def test_a_part_that_varies_is_the_variant_its_request_selects_and_never_one_chosen_by_a_credential():
    """S3 with CORS sends Vary: Origin on every answer."""
    headers = {"Content-Range": "bytes 0-9/100", "ETag": ETAG, "Vary": "Origin"}
    plain, other = part_of(206, headers, {}), part_of(206, headers, {"Origin": "https://a.example"})
    assert plain.vary == other.vary == ("origin",)
    assert plain.same_object(part_of(206, {**headers, "Content-Range": "bytes 10-19/100"}, {}))
    assert not plain.same_object(other)
    assert "credential" in part_of(206, {**headers, "Vary": "Authorization"}, {})


@pytest.mark.parametrize("status,headers,why", [
    (200, {"ETag": ETAG}, "status 200"),
    (206, {"Content-Range": "bytes 0-9/*", "ETag": ETAG}, "not one byte range of a known length"),
    (206, {"Content-Type": "multipart/byteranges; boundary=x", "ETag": ETAG}, "not one byte range"),
    (206, {"Content-Range": "bytes 10-9/100", "ETag": ETAG}, "not within its length"),
    (206, {"Content-Range": "bytes 0-100/100", "ETag": ETAG}, "not within its length"),
    (206, {"Content-Range": "bytes 0-9/100"}, "not one strong validator"),
    (206, {"Content-Range": "bytes 0-9/100", "ETag": 'W/"v1"'}, "not one strong validator"),
    (206, {"Content-Range": "bytes 0-9/100", "ETag": ETAG, "Cache-Control": "no-store"}, "no-store"),
    (206, {"Content-Range": "bytes 0-9/100", "ETag": ETAG, "Vary": "*"}, "names no field"),
    (206, {"Content-Range": "bytes 0-9/100", "ETag": ETAG, "Set-Cookie": "s=1"}, "cookie"),
])
def test_rfc9111_3_4_only_parts_that_share_a_strong_validator_may_be_combined(status, headers, why):
    """§3.4: parts are combined only under one strong validator; anything
    else a part cannot say about itself (its length, its range) refuses it."""
    reason = part_of(status, headers, {})
    assert isinstance(reason, str) and why in reason


def test_extents_merge_touching_and_overlapping_spans_and_say_what_they_cover():
    held = Extents()
    held.add(16, 20)
    held.add(0, 8)
    assert not held.covers(0, 20) and held.covers(2, 8) and not held.covers(7, 9)
    held.add(8, 12)  # touches [0, 8)
    held.add(10, 17)  # overlaps both
    assert held.spans == [(0, 20)] and held.covers(0, 20) and held.held == 20
    held.add(5, 5)
    assert held.spans == [(0, 20)] and held.covers(3, 3)
