"""FieldLines: a message's fields read once give every reader the same answers as the fields themselves."""

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from cachenode.http.digests import expectations
from cachenode.http.fields import FieldLines, field_value
from cachenode.http.freshness import current_age, response_policy
from cachenode.http.headers import connection_listed, delimited_by_close, end_to_end_pairs, stored_pairs
from cachenode.http.vary import vary_names

NOW = 1_000_000.0
MESSAGES = [
    [],
    [("Cache-Control", "no-cache"), ("cache-control", "max-age=60"), ("Vary", "")],
    [("VARY", "Accept"), ("Other", "x"), ("vary", "Accept-Encoding"), ("Date", "Mon, 12 Jan 1970 13:46:40 GMT")],
    [("Connection", "keep-alive, X-Hop"), ("X-Hop", "1"), ("Keep-Alive", "timeout=5"), ("Content-Length", "3"),
     ("Age", "7"), ("Age", "9"), ("Set-Cookie", "a=b"), ("X-Nezha-Cache", "hit"), ("ETag", '"e"'),
     ("Proxy-Authenticate", "Basic"), ("Last-Modified", "Sun, 11 Jan 1970 13:46:40 GMT")],
    [("CDN-Cache-Control", "max-age=600"), ("Cache-Control", "private"), ("Expires", "0"),
     ("Nezha-Cache-Control", "")],
]
NAMES = ["Cache-Control", "cache-control", "VARY", "Vary", "Age", "date", "Connection", "Absent", "nezha-cache-control"]


@pytest.mark.parametrize("pairs", MESSAGES)
def test_every_field_reads_the_same_from_field_lines_as_from_a_case_insensitive_multidict(pairs):
    lines, multi = FieldLines(pairs), CIMultiDictProxy(CIMultiDict(pairs))
    for name in NAMES:
        assert field_value(lines, name) == field_value(multi, name)
        assert (name in lines) == (name in multi)
        assert lines.get(name) == multi.get(name)
    assert list(lines.items()) == list(multi.items()) == pairs
    assert list(lines) == [n for n, _ in pairs] and len(lines) == len(pairs)


@pytest.mark.parametrize("pairs", MESSAGES)
def test_a_response_is_judged_and_kept_the_same_from_field_lines(pairs):
    lines, multi = FieldLines(pairs), CIMultiDictProxy(CIMultiDict(pairs))
    targeted = ("Nezha-Cache-Control", "CDN-Cache-Control")
    assert response_policy(200, lines, now=NOW, policy_ttl=None, targeted=targeted) == \
        response_policy(200, multi, now=NOW, policy_ttl=None, targeted=targeted)
    assert current_age(lines, NOW) == current_age(multi, NOW)
    assert vary_names(lines) == vary_names(multi)
    assert connection_listed(lines) == connection_listed(pairs)
    assert end_to_end_pairs(lines, drop=frozenset({"etag"})) == end_to_end_pairs(pairs, drop=frozenset({"etag"}))
    assert stored_pairs(lines) == stored_pairs(multi) == stored_pairs(pairs)


def test_a_field_lines_lookup_ignores_case_and_gives_the_first_line():
    lines = FieldLines([("Age", "7"), ("AGE", "9")])
    assert lines["age"] == "7" and lines.lines("aGe") == ["7", "9"] and lines.lines("Date") is None
    with pytest.raises(KeyError):
        lines["Date"]


MD5 = "XUFAKrxLKna5cZ2REBfFkg=="  # base64 of MD5("hello")
PUBLISHED = [
    [],
    [("Content-MD5", MD5), ("ETag", '"e"')],
    [("content-md5", "not base64"), ("X-Amz-Checksum-CRC32", "AAAAAA==-3")],
    [("X-Goog-Hash", f"md5={MD5}"), ("Content-Encoding", "gzip")],
    [("Repr-Digest", "sha-256=:AAAA:"), ("Content-Digest", "sha-512=:AAAA:")],
]


@pytest.mark.parametrize("pairs", PUBLISHED)
def test_the_digests_an_answer_publishes_read_the_same_from_field_lines(pairs):
    for linked in (None, "a" * 64):
        assert expectations(FieldLines(pairs), status=200, linked_etag=linked) == \
            expectations(pairs, status=200, linked_etag=linked)


FRAMINGS = [
    [],
    [("Content-Length", "3")],
    [("Transfer-Encoding", "chunked")],
    [("transfer-encoding", "gzip"), ("Transfer-Encoding", "chunked"), ("Content-Length", "3")],
    [("Transfer-Encoding", "gzip, chunked"), ("TRANSFER-ENCODING", "")],
    [("Transfer-Encoding", ""), ("Content-Length", "3")],
]


@pytest.mark.parametrize("pairs", FRAMINGS)
def test_whether_a_body_ends_only_at_close_reads_the_same_from_field_lines(pairs):
    for status, method in ((200, "GET"), (200, "HEAD"), (204, "GET"), (500, "GET")):
        assert delimited_by_close(status, FieldLines(pairs), method=method) == \
            delimited_by_close(status, pairs, method=method)
