"""Which requests the fast path may answer itself. Everything else goes to aiohttp."""

import pytest

from cachenode.front import fastpath
from cachenode.front.fastpath import PlainRequest, parse_plain, plain_request

GET = b"GET /~kriz/c.tar.gz HTTP/1.1\r\nHost: www.cs.toronto.edu\r\n"


PLAIN = [
    GET + b"\r\n",
    GET + b"User-Agent: Wget/1.21\r\nAccept: */*\r\nAccept-Encoding: identity\r\nConnection: Keep-Alive\r\n\r\n",
    b"HEAD /x HTTP/1.1\r\nhost: h.example\r\n\r\n",
    # A child node asking its parent tier: the marker, and Via beside it.
    GET + b"X-Nezha-From-Child: 1\r\nVia: 1.1 sidecar\r\nAccept: */*\r\n\r\n",
    GET + b"X-Nezha-From-Child: 1\r\n\r\n",
]


@pytest.mark.parametrize("raw", PLAIN)
def test_plain_requests_are_accepted_with_their_exact_head(raw):
    req = parse_plain(raw + b"GET /next")
    assert isinstance(req, PlainRequest) and req.size == len(raw)
    assert req.method in ("GET", "HEAD") and req.target.startswith("/")


def test_an_incomplete_head_asks_for_more_bytes():
    assert parse_plain(GET) is None


NOT_PLAIN = [
    GET + b"Range: bytes=0-1\r\n\r\n",
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


def test_remembered_heads_stay_bounded_in_count_and_size():
    """Clients choose the heads: at most _JUDGED_MAX of them, none longer than _JUDGED_HEAD_MAX, are kept."""
    fastpath._JUDGED.clear()
    long_head = GET + b"User-Agent: " + b"a" * 2000 + b"\r\n\r\n"
    assert isinstance(plain_request(bytearray(long_head)), PlainRequest)
    assert not fastpath._JUDGED  # judged, not kept
    for i in range(fastpath._JUDGED_MAX + 10):
        plain_request(bytearray(b"GET /o%d HTTP/1.1\r\nHost: h.example\r\n\r\n" % i))
    assert 0 < len(fastpath._JUDGED) <= fastpath._JUDGED_MAX
    assert sum(map(len, fastpath._JUDGED)) <= fastpath._JUDGED_MAX * fastpath._JUDGED_HEAD_MAX
