import pytest

from cachenode.http.conditionals import Decision, Outcome, evaluate, parse_range, preconditions

ETAG = '"abc"'
LM = "Wed, 01 Jan 2025 00:00:00 GMT"


@pytest.mark.parametrize("value,size,expect", [
    ("bytes=0-9", 100, (0, 10)),
    ("bytes=90-", 100, (90, 10)),
    ("bytes=-5", 100, (95, 5)),
    ("bytes=-500", 100, (0, 100)),
    ("bytes=50-5000", 100, (50, 50)),
    ("bytes=100-", 100, False),
    ("bytes=-0", 100, False),
    ("bytes=9-3", 100, None),
    ("bytes=0-1,3-4", 100, None),
    ("lines=0-1", 100, None),
    ("bytes=a-b", 100, None),
    ("bytes=0-0", 0, False),
])
def test_parse_range(value, size, expect):
    assert parse_range(value, size) == expect


@pytest.mark.parametrize("headers,expect", [
    ({}, Decision(Outcome.FULL, 0, 100)),
    ({"Range": "bytes=10-19"}, Decision(Outcome.PARTIAL, 10, 10)),
    ({"Range": "bytes=200-"}, Decision(Outcome.UNSATISFIABLE)),
    ({"If-None-Match": ETAG}, Decision(Outcome.NOT_MODIFIED)),
    ({"If-None-Match": 'W/"abc"'}, Decision(Outcome.NOT_MODIFIED)),
    ({"If-None-Match": '"zzz", "abc"'}, Decision(Outcome.NOT_MODIFIED)),
    ({"If-None-Match": '"zzz"', "If-Modified-Since": "Thu, 01 Jan 2026 00:00:00 GMT"}, Decision(Outcome.FULL, 0, 100)),
    ({"If-Modified-Since": LM}, Decision(Outcome.NOT_MODIFIED)),
    ({"If-Modified-Since": "Tue, 31 Dec 2024 00:00:00 GMT"}, Decision(Outcome.FULL, 0, 100)),
    ({"If-Match": '"zzz"'}, Decision(Outcome.PRECONDITION_FAILED)),
    ({"If-Match": ETAG, "Range": "bytes=0-0"}, Decision(Outcome.PARTIAL, 0, 1)),
    ({"If-Unmodified-Since": "Tue, 31 Dec 2024 00:00:00 GMT"}, Decision(Outcome.PRECONDITION_FAILED)),
    ({"Range": "bytes=0-0", "If-Range": ETAG}, Decision(Outcome.PARTIAL, 0, 1)),
    ({"Range": "bytes=0-0", "If-Range": '"old"'}, Decision(Outcome.FULL, 0, 100)),
    ({"Range": "bytes=0-0", "If-Range": LM}, Decision(Outcome.PARTIAL, 0, 1)),
    ({"Range": "bytes=0-0", "If-Range": "Tue, 31 Dec 2024 00:00:00 GMT"}, Decision(Outcome.FULL, 0, 100)),
])
def test_evaluate_follows_rfc9110_precedence(headers, expect):
    assert evaluate(headers, size=100, etag=ETAG, last_modified=LM) == expect


@pytest.mark.parametrize("headers,expect", [
    ({}, None),
    ({"Range": "bytes=0-9"}, None),
    ({"If-None-Match": ETAG}, Outcome.NOT_MODIFIED),
    ({"If-None-Match": '"zzz"'}, None),
    ({"If-Modified-Since": LM}, Outcome.NOT_MODIFIED),
    ({"If-Match": '"zzz"'}, Outcome.PRECONDITION_FAILED),
    ({"If-Match": ETAG, "If-None-Match": ETAG}, Outcome.NOT_MODIFIED),
    ({"If-Match": '"zzz"', "If-None-Match": ETAG}, Outcome.PRECONDITION_FAILED),
    ({"If-Unmodified-Since": "Tue, 31 Dec 2024 00:00:00 GMT"}, Outcome.PRECONDITION_FAILED),
])
def test_preconditions_need_no_size(headers, expect):
    """Validators alone decide 304 and 412, so an object of unknown length is judged like a stored one."""
    assert preconditions(headers, etag=ETAG, last_modified=LM) == expect
