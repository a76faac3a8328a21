"""When a fill goes parallel, and which range answers may be written (cachenode/fill/parallel.py). Pure."""

from __future__ import annotations

import pytest

from cachenode.fill.parallel import Validator, parallel_validator, partial_mismatch

MiB = 1 << 20
OK = {"Accept-Ranges": "bytes", "ETag": '"abc"', "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT"}


def decide(headers=OK, *, status=200, length=100 * MiB, streams=8, threshold=64 * MiB):
    return parallel_validator(status, headers, length, streams=streams, threshold=threshold)


def test_a_large_object_with_ranges_and_a_strong_etag_goes_parallel_under_that_etag():
    v = decide()
    assert v is not None and v.if_range == '"abc"'


@pytest.mark.parametrize("why, kwargs", [
    ("below the threshold", {"length": 64 * MiB - 1}),
    ("length unknown", {"length": None}),
    ("one stream configured", {"streams": 1}),
    ("not a 200", {"status": 206}),
    ("no Accept-Ranges", {"headers": {"ETag": '"abc"'}}),
    ("Accept-Ranges: none", {"headers": {**OK, "Accept-Ranges": "none"}}),
    ("only a weak ETag", {"headers": {"Accept-Ranges": "bytes", "ETag": 'W/"abc"'}}),
    ("no validator", {"headers": {"Accept-Ranges": "bytes"}}),
])
def test_otherwise_the_fill_is_one_stream(why, kwargs):
    assert decide(**kwargs) is None, why


def test_without_a_strong_etag_last_modified_is_the_validator():
    v = decide({"Accept-Ranges": "bytes", "ETag": 'W/"weak"', "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT"})
    assert v is not None and v.if_range == "Wed, 01 Jan 2025 00:00:00 GMT"


V = Validator(etag='"abc"', last_modified=None)


def answer(status=206, content_range="bytes 100-199/1000", **extra):
    return status, {"Content-Range": content_range, "ETag": '"abc"', "Content-Length": "100", **extra}


@pytest.mark.parametrize("status, headers, reason", [
    (*answer(status=200), "answered 200"),
    (*answer(content_range="bytes 101-200/1000"), "asked for 100-199/1000"),
    (*answer(content_range="bytes 100-199/999"), "asked for 100-199/1000"),
    (*answer(content_range="bytes */1000"), "not a byte range"),
    (*answer(ETag='"other"'), "ETag"),
    (*answer(**{"Content-Length": "99"}), "Content-Length 99"),
])
def test_a_range_answer_for_other_bytes_or_another_version_is_refused(status, headers, reason):
    why = partial_mismatch(status, headers, first=100, last=199, total=1000, validator=V)
    assert why is not None and reason in why


def test_the_exact_range_of_the_same_version_is_written():
    assert partial_mismatch(*answer(), first=100, last=199, total=1000, validator=V) is None
