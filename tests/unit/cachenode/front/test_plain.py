"""Which requests the fast path may answer itself. Everything else goes to aiohttp."""

import pytest

from cachenode.front import plain
from cachenode.front.exact_head import encode_head
from cachenode.front.plain import PlainRequest, parse_plain, partial_head, plain_request, response_head, wanted_range
from cachenode.store.objects import Meta

GET = b"GET /~kriz/c.tar.gz HTTP/1.1\r\nHost: www.cs.toronto.edu\r\n"


PLAIN = [
    GET + b"\r\n",
    GET + b"User-Agent: Wget/1.21\r\nAccept: */*\r\nAccept-Encoding: identity\r\nConnection: Keep-Alive\r\n\r\n",
    b"HEAD /x HTTP/1.1\r\nhost: h.example\r\n\r\n",
    # A child node asking its parent tier: the marker, and Via beside it.
    GET + b"X-Nezha-From-Child: 1\r\nVia: 1.1 sidecar\r\nAccept: */*\r\n\r\n",
    GET + b"X-Nezha-From-Child: 1\r\n\r\n",
    # One byte range, in the forms multipart downloads send, with or without If-Range.
    GET + b"Range: bytes=0-1\r\n\r\n",
    GET + b"range:bytes=100-  \r\nUser-Agent: aws-cli/2\r\n\r\n",
    GET + b"Range: bytes=-500\r\nIf-Range: \"abc\"\r\n\r\n",
]


@pytest.mark.parametrize("raw", PLAIN)
def test_plain_requests_are_accepted_with_their_exact_head(raw):
    req = parse_plain(raw + b"GET /next")
    assert isinstance(req, PlainRequest) and req.size == len(raw)
    assert req.method in ("GET", "HEAD") and req.target.startswith("/")


def test_an_incomplete_head_asks_for_more_bytes():
    assert parse_plain(GET) is None


NOT_PLAIN = [
    # Ranges the handler judges: several, another unit, spaces inside, no number, two Range fields.
    GET + b"Range: bytes=0-1,5-6\r\n\r\n",
    GET + b"Range: items=0-1\r\n\r\n",
    GET + b"Range: bytes = 0-1\r\n\r\n",
    GET + b"Range: bytes=-\r\n\r\n",
    GET + b"Range: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n",
    GET + b"Range: bytes=0-1\r\nIf-Range: \"a\"\r\nIf-Range: \"b\"\r\n\r\n",
    GET + b"Range: bytes=1234567890123456789-\r\n\r\n",
    GET + b"If-None-Match: \"x\"\r\n\r\n",
    GET + b"Authorization: Bearer t\r\n\r\n",
    GET + b"Cookie: a=b\r\n\r\n",
    GET + b"X-Nezha-Peer: n1\r\n\r\n",
    # Via without a child's marker may be a loop, which the handler answers 508.
    GET + b"Via: 1.1 sidecar\r\n\r\n",
    GET + b"X-Nezha-From-Child: 1\r\nX-Nezha-From-Child: 1\r\n\r\n",
    GET + b"Cache-Control: only-if-cached\r\n\r\n",
    GET + b"Connection: close\r\n\r\n",
    GET + b"Content-Length: 5\r\n\r\n",
    GET + b"Transfer-Encoding: chunked\r\n\r\n",
    GET + b"Host: second.example\r\n\r\n",
    GET + b" folded: line\r\n\r\n",
    GET + b"Bad Name: x\r\n\r\n",
    GET + b"Accept: a\x01b\r\n\r\n",
    b"GET /x HTTP/1.0\r\nHost: h\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET  /x HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /x HTTP/1.1\r\n\r\n",
    b"GET /\xff HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: h\r\n" + b"A" * 9000,
    # Bare LF anywhere in the head, complete or not: aiohttp answers 400 at
    # once, where waiting for CRLF CRLF would hold the client.
    b"GET /x HTTP/1.1\nHost: h\n\n",
    b"GET /x HTTP/1.1\r\nHost: h\r\n\n",
    b"GET /x HTTP/1.1\r\nHost: h\n\r\n",
    b"GET /x HTTP/1.1\nHo",
]


@pytest.mark.parametrize("raw", NOT_PLAIN)
def test_anything_else_is_left_to_aiohttp(raw):
    assert parse_plain(raw) is False


@pytest.mark.parametrize("raw", [*PLAIN, *NOT_PLAIN, GET])
def test_a_remembered_verdict_is_the_verdict_of_the_head_itself(raw):
    """plain_request remembers verdicts by head bytes: first and later calls, and any bytes after the head,
    give exactly what parse_plain gives."""
    for tail in (b"", b"GET /next", b"", b"POST /other HTTP/1.1\r\n\r\n"):
        assert plain_request(bytearray(raw + tail)) == parse_plain(raw + tail)


LINES = [b"GET /a HTTP/1.1", b"HEAD /b/c.bin?x=1 HTTP/1.1", b"GET /x HTTP/1.0", b"POST /x HTTP/1.1", b"GET /\xff HTTP/1.1",
         b"GET  /x HTTP/1.1", b"GET /x\nHTTP/1.1", b"GET /x\n HTTP/1.1", b"GET /x HTTP/1.1\r", b"GET", b""]


def test_a_head_not_seen_before_gets_the_verdict_of_its_own_request_line_and_fields():
    """Field lines are judged once per block of them, whatever request line they came with: each new head,
    with a block seen before or not, gets exactly what parse_plain gives it."""
    blocks = [raw[raw.index(b"\r\n"):] for raw in [*PLAIN, *NOT_PLAIN] if b"\r\n\r\n" in raw]
    for memo in (plain._JUDGED, plain._JUDGED_RANGED, plain._FIELDS, plain._FIELDS_RANGED):
        memo.clear()
    for n, (block, line) in enumerate((b, line) for _ in range(2) for b in blocks for line in LINES):
        raw = line.replace(b"/", b"/%d/" % n, 1) + block  # a head of its own each time: a path not asked before
        assert plain_request(bytearray(raw + b"GET /next")) == parse_plain(raw), raw
    assert plain._FIELDS and plain._FIELDS_RANGED  # blocks were remembered, and the second pass read them


# Request lines at the edges of plain: a lone CR, a tab or a control byte in the
# target, an extra space anywhere, the version or method a byte off.
REQUEST_LINES = [*LINES, b"get /a HTTP/1.1", b"GET /a\rb HTTP/1.1", b"GET /a\r HTTP/1.1", b"GET /a\tb HTTP/1.1",
                 b"GET /a\x00 HTTP/1.1", b"GET /\x7f HTTP/1.1", b"GET /a HTTP/1.1 ", b"GET /a HTTP/1.11",
                 b"GET  HTTP/1.1", b"HEAD * HTTP/1.1", b"GET http://h.example/a HTTP/1.1", b"GETX /a HTTP/1.1",
                 b"GET /a HTTP/1.1\r\r", b" GET /a HTTP/1.1", b"GET /a /b HTTP/1.1", b"GET /a HTTP/1.1\x00",
                 b"GET /a\xc3\xa9 HTTP/1.1", b"HEAD /a HTTP/1.1\t"]


def _split_at_spaces(line: bytes) -> tuple[str, str] | bool:
    """The request line rule as plain.py first wrote it: ASCII without LF, three parts at single spaces."""
    if b"\n" in line or not line.isascii():
        return False
    parts = line.decode("ascii").split(" ")
    if len(parts) != 3 or parts[0] not in ("GET", "HEAD") or parts[2] != "HTTP/1.1" or not parts[1]:
        return False
    return parts[0], parts[1]


@pytest.mark.parametrize("line", REQUEST_LINES)
def test_a_request_line_is_plain_where_it_splits_at_single_spaces_into_get_or_head_a_target_and_http_1_1(line):
    """The one regular expression that reads a request line accepts exactly the lines the split rule accepts,
    with the same method and target, the line being what comes before the head's first CRLF."""
    for fields in (b"Host: h.example\r\n\r\n", b"\r\n"):
        raw = line + b"\r\n" + fields
        asked = _split_at_spaces(raw[:raw.index(b"\r\n")])
        for got in (parse_plain(raw), plain_request(bytearray(raw)), plain_request(bytearray(raw))):
            if asked is False or fields == b"\r\n":  # no Host: not plain whatever the line
                assert got is False, raw
            else:
                assert isinstance(got, PlainRequest) and (got.method, got.target) == asked, raw


def test_remembered_heads_stay_bounded_in_count_and_size():
    """Clients choose the heads: at most _JUDGED_MAX of them, none longer than _JUDGED_HEAD_MAX, are kept."""
    plain._JUDGED.clear()
    long_head = GET + b"User-Agent: " + b"a" * 2000 + b"\r\n\r\n"
    assert isinstance(plain_request(bytearray(long_head)), PlainRequest)
    assert not plain._JUDGED  # judged, not kept
    for i in range(plain._JUDGED_MAX + 10):
        plain_request(bytearray(b"GET /o%d HTTP/1.1\r\nHost: h.example\r\n\r\n" % i))
    assert 0 < len(plain._JUDGED) <= plain._JUDGED_MAX
    assert sum(map(len, plain._JUDGED)) <= plain._JUDGED_MAX * plain._JUDGED_HEAD_MAX
    plain._JUDGED_RANGED.clear()
    for i in range(plain._JUDGED_MAX + 10):  # ranged heads of as many objects
        plain_request(bytearray(b"GET /o%d HTTP/1.1\r\nHost: h.example\r\nRange: bytes=%d-\r\n\r\n" % (i, i)))
    assert 0 < len(plain._JUDGED_RANGED) <= plain._JUDGED_MAX
    plain._FIELDS.clear()
    for i in range(plain._JUDGED_MAX + 10):  # as many blocks of fields
        plain_request(bytearray(b"GET /o HTTP/1.1\r\nHost: h%d.example\r\n\r\n" % i))
    assert 0 < len(plain._FIELDS) <= plain._JUDGED_MAX


def test_a_range_and_if_range_are_read_with_the_head():
    req = parse_plain(GET + b"Range:  bytes=100-199 \r\nIf-Range: \"e\"\r\n\r\n")
    assert (req.range, req.if_range) == ("bytes=100-199", '"e"')
    assert parse_plain(GET + b"\r\n").range is None


def test_heads_differing_only_in_their_range_are_remembered_once_each_with_its_own_range():
    """A loader reading one object in ten thousand ranges leaves one entry, and each request gets its range
    and its head's length, exactly as parse_plain reads them."""
    plain._JUDGED_RANGED.clear()
    for start in range(0, 10_000_000, 1000):
        raw = GET + b"Range: bytes=%d-%d\r\nAccept: */*\r\n\r\n" % (start, start + 999)
        req = plain_request(bytearray(raw + b"GET /next"))
        assert req == parse_plain(raw) and req.range == f"bytes={start}-{start + 999}"
    assert len(plain._JUDGED_RANGED) == 1


def test_a_remembered_ranged_head_does_not_lend_its_verdict_to_another_head():
    """The range is left out of what is remembered, nothing else: a head that differs elsewhere is judged anew."""
    plain._JUDGED.clear()
    plain._JUDGED_RANGED.clear()
    assert isinstance(plain_request(bytearray(GET + b"Range: bytes=0-1\r\n\r\n")), PlainRequest)
    assert plain_request(bytearray(GET + b"Range: bytes=0-1\r\nCookie: a=b\r\n\r\n")) is False
    assert plain_request(bytearray(GET + b"Range: bytes=0-1,3-4\r\n\r\n")) is False
    # The first head with its range cut out: a head of its own, with an empty Range, not plain.
    assert plain_request(bytearray(GET + b"Range: \r\n\r\n")) is False
    assert isinstance(plain_request(bytearray(GET + b"Range: bytes=7-\r\n\r\n")), PlainRequest)


ETAG = '"v1"'
LM = "Wed, 01 Jan 2025 00:00:00 GMT"
META = Meta(key="k", url="u", host="h", size=1000, headers=(("ETag", ETAG), ("Last-Modified", LM)),
            stored_at=0.0, expires_at=1.0)


@pytest.mark.parametrize("rng,if_range,expect", [
    (None, None, None),
    ("bytes=0-99", None, (0, 100)),
    ("bytes=990-", None, (990, 10)),
    ("bytes=-10", None, (990, 10)),
    ("bytes=-5000", None, (0, 1000)),
    ("bytes=900-5000", None, (900, 100)),
    ("bytes=1000-", None, False),  # unsatisfiable: the handler's 416
    ("bytes=-0", None, False),
    ("bytes=5-3", None, False),  # ignored there: the handler's whole object
    ("bytes=0-99", ETAG, (0, 100)),
    ("bytes=0-99", '"v2"', None),  # another version: the whole object
    ("bytes=0-99", "W/" + ETAG, None),
    ("bytes=0-99", LM, (0, 100)),
    ("bytes=0-99", "Wed, 01 Jan 2025 00:00:01 GMT", None),
    (None, ETAG, None),
])
def test_wanted_range_is_what_the_handler_would_send(rng, if_range, expect):
    req = PlainRequest("GET", "/o", "h", 40, rng, if_range)
    assert wanted_range(req, META) == expect


def test_a_partial_head_leaves_off_the_whole_bodys_length_and_digests_and_keeps_the_rest():
    head = (b"HTTP/1.1 200 OK\r\nETag: \"v1\"\r\nContent-MD5: m\r\nx-amz-checksum-sha256: s\r\n"
            b"Repr-Digest: r\r\nVia: 1.1 n\r\nX-Nezha-Cache: hit\r\nContent-Length: 1000\r\n")
    assert partial_head(head) == (b"HTTP/1.1 206 Partial Content\r\nETag: \"v1\"\r\nRepr-Digest: r\r\n"
                                  b"Via: 1.1 n\r\nX-Nezha-Cache: hit\r\n")
    assert partial_head(head) is partial_head(head)  # made once per stored head


def _head_of(headers, *, hot=False, served_by=None, label=None) -> bytes:
    meta = Meta(key="k", url="u", host="h", size=5, headers=headers, stored_at=784111777.0, expires_at=0.0, hot=hot)
    return response_head(meta, via="1.1 node-0 (nezha)", served_by=served_by, label=label)


def test_a_stored_head_without_a_date_is_dated_when_stored_and_told_it_takes_ranges():
    assert _head_of((("ETag", '"v1"'),)) == (
        b'HTTP/1.1 200 OK\r\nETag: "v1"\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nAccept-Ranges: bytes\r\n'
        b"Via: 1.1 node-0 (nezha)\r\nX-Nezha-Cache: hit\r\nContent-Length: 5\r\n")


def test_a_stored_heads_own_date_accept_ranges_and_vias_are_kept_once_in_their_place():
    stored = (("date", "Sat, 05 Nov 1994 08:49:37 GMT"), ("VIA", "1.1 origin-lb"), ("Accept-Ranges", "none"),
              ("Via", "1.0 squid"), ("X-Y", "z"))
    assert _head_of(stored, hot=True, served_by="node-2", label=None) == (
        b"HTTP/1.1 200 OK\r\ndate: Sat, 05 Nov 1994 08:49:37 GMT\r\nAccept-Ranges: none\r\nX-Y: z\r\n"
        b"Via: 1.1 origin-lb, 1.0 squid, 1.1 node-0 (nezha)\r\nX-Nezha-Cache: hot-hit\r\nContent-Length: 5\r\n"
        b"X-Nezha-Served-By: node-2\r\n")


@pytest.mark.parametrize("hot, served_by, label", [(False, None, None), (True, "node-2", None), (True, None, None),
                                                   (False, "node-2", "miss")])
def test_a_stored_heads_raw_octets_reach_the_client_as_the_origin_sent_them(hot, served_by, label):
    """Written out line by line, the head is the one `encode_head` makes of the same fields in the same order."""
    raw = b"attachment; filename=\xff\xc3\xa9.bin".decode("utf-8", "surrogateescape")
    stored = (("Content-Disposition", raw), ("Via", "1.1 o\u00e9"), ("ETag", '"v1"'), ("Date", "Sat, 05 Nov 1994"))
    pairs = [("Content-Disposition", raw), ("ETag", '"v1"'), ("Date", "Sat, 05 Nov 1994"), ("Accept-Ranges", "bytes"),
             ("Via", "1.1 o\u00e9, 1.1 node-0 (nezha)"), ("X-Nezha-Cache", label or ("hot-hit" if hot else "hit")),
             ("Content-Length", "5"), *([("X-Nezha-Served-By", served_by)] if hot and served_by else [])]
    head = _head_of(stored, hot=hot, served_by=served_by, label=label)
    assert head == encode_head("HTTP/1.1 200 OK", pairs)[:-2]
    assert b"filename=\xff\xc3\xa9.bin\r\n" in head
