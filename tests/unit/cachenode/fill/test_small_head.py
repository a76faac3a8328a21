"""The head of an answer as the node's small gets read it
(cachenode/fill/small_head.py): what it accepts reads as aiohttp's own
parser reads it, and every head it cannot read plainly is declined."""

from __future__ import annotations

import asyncio
import random
import re
from unittest import mock

import pytest
from aiohttp import HttpVersion
from aiohttp._http_parser import HttpResponseParser  # the C parser a node's aiohttp reads answers with

from cachenode.fill import small_head
from cachenode.fill.small_head import LINE_MAX, read_head

NGINX = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Sun, 29 Nov 2026 03:20:11 GMT\r\n"
         b"Content-Type: application/octet-stream\r\nContent-Length: 16384\r\n"
         b"Last-Modified: Sun, 29 Nov 2026 02:58:40 GMT\r\nConnection: keep-alive\r\n"
         b"ETag: \"6a6b2d40-4000\"\r\nAccept-Ranges: bytes")


def aiohttp_reads(head: bytes):
    """The message aiohttp's C parser makes of `head` and an empty body."""

    async def parse():
        parser = HttpResponseParser(mock.Mock(), asyncio.get_running_loop(), 2**16, max_line_size=8190,
                                    max_field_size=8190)
        messages, _, _ = parser.feed_data(head + b"\r\n\r\n")
        return messages[0][0]

    return asyncio.run(parse())


ACCEPTED = [
    pytest.param(NGINX, id="nginx"),
    pytest.param(NGINX.replace(b"HTTP/1.1", b"HTTP/1.0", 1), id="http_1_0_keep_alive"),
    pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 0", id="http_1_0"),
    pytest.param(b"HTTP/1.1 200\r\nContent-Length: 5", id="no_reason"),
    pytest.param(b"HTTP/1.1 200 \r\ncontent-length:5", id="empty_reason_no_space"),
    pytest.param(b"HTTP/1.1 200 All\tfine\r\nContent-Length: 5\r\nX-Empty:\r\nX-Blank: \t ",
                 id="tab_reason_empty_values"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length:\t5\t \r\nx-a: 1\r\nX-A: two  words \r\netag: e",
                 id="ows_and_repeats"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Note: caf\xc3\xa9 \xff\xe2\x82", id="obs_text"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-C1: a\xc2\x80b\xc2\x9f", id="obs_text_decoded_to_c1"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: Keep-Alive, close", id="close_listed"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 000000000000000005", id="eighteen_digits"),
]


@pytest.mark.parametrize("head", ACCEPTED)
def test_an_accepted_head_reads_as_aiohttps_parser_reads_it(head: bytes) -> None:
    """Names (as `hdrs` spells a known one), values, order, reason, version and reuse are aiohttp's,
    with its lines read anew and read again from those remembered (`_LINES`)."""
    message = aiohttp_reads(head)
    small_head._LINES.clear()
    names = None
    for _ in range(2):
        got = read_head(head, 1 << 20)
        assert got is not None
        assert got.pairs == list(message.headers.items())
        assert names is None or [type(name) for name, _ in got.pairs] == names  # stored as the first read stored
        names = [type(name) for name, _ in got.pairs]
        assert (got.reason, got.version, got.length) == (message.reason, message.version,
                                                         int(message.headers["Content-Length"]))
        assert got.keep is not message.should_close


@pytest.mark.parametrize("head", [
    pytest.param(b"HTTP/1.1 103 Early Hints\r\nLink: </a>", id="interim"),
    pytest.param(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2", id="other_status"),
    pytest.param(b"HTTP/1.1 2000 OK\r\nContent-Length: 2", id="four_digit_status"),
    pytest.param(b"HTTP/2 200 OK\r\nContent-Length: 2", id="http_2"),
    pytest.param(b"HTTP/1.2 200 OK\r\nContent-Length: 2", id="http_1_2"),
    pytest.param(b"http/1.1 200 OK\r\nContent-Length: 2", id="lowercase_version"),
    pytest.param(b" HTTP/1.1 200 OK\r\nContent-Length: 2", id="space_before_status"),
    pytest.param(b"HTTP/1.1  200 OK\r\nContent-Length: 2", id="two_spaces"),
    pytest.param(b"HTTP/1.1 200 O\x7fK\r\nContent-Length: 2", id="control_in_reason"),
    pytest.param(b"HTTP/1.1 200 \xc3\xa9\r\nContent-Length: 2", id="obs_text_in_reason"),
    pytest.param(b"HTTP/1.1 200 OK", id="no_field"),
    pytest.param(b"HTTP/1.1 200 OK\r\nConnection: keep-alive", id="no_length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", id="chunked"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ntransfer-encoding: identity", id="length_and_coding"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2", id="duplicate_length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 3", id="two_lengths"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2", id="length_list"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: -2", id="negative_length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: +2", id="signed_length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 1_0", id="underscore_length"),
    pytest.param("HTTP/1.1 200 OK\r\nContent-Length: \u0661".encode(), id="arabic_indic_digit"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: ", id="empty_length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 0000000000000000005", id="nineteen_digits"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2000001", id="too_large"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n folded", id="obs_fold"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\tfolded", id="obs_fold_tab"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length : 2", id="space_before_colon"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n: empty name", id="empty_name"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nNo colon", id="no_colon"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX@Y: 1", id="bad_name"),
    pytest.param("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-\u00e9: 1".encode(), id="obs_text_in_name"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\x01", id="control_in_value"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\x7f", id="del_in_value"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\rX-B: 2", id="bare_cr"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\nX-B: 2", id="bare_lf"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", id="empty_line"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Big: " + b"y" * LINE_MAX, id="long_line"),
])
def test_a_head_not_read_plainly_or_not_a_small_200_is_declined(head: bytes) -> None:
    small_head._LINES.clear()
    assert read_head(head, 2_000_000) is None
    assert read_head(head, 2_000_000) is None  # its lines remembered


def test_a_line_of_line_max_bytes_is_read_and_one_more_is_declined() -> None:
    def head(line_length: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Big: " + b"y" * (line_length - len(b"X-Big: "))

    assert read_head(head(LINE_MAX), 2) is not None
    assert read_head(head(LINE_MAX + 1), 2) is None


@pytest.mark.parametrize("version, connection, keep", [
    (b"1.1", None, True),
    (b"1.1", b"keep-alive", True),
    (b"1.1", b"close", False),
    (b"1.1", b" CLOSE ,", False),
    (b"1.1", b"Keep-Alive, Close", False),
    (b"1.0", None, False),
    (b"1.0", b"Keep-Alive", True),
    (b"1.0", b"x, keep-alive", True),
    (b"1.0", b"keep-alive, close", False),
    # Lowercased as bytes are, only in ASCII: the Kelvin sign, which str.lower() makes a "k", is no keep-alive.
    (b"1.0", "\u212aeep-alive".encode(), False),
    (b"1.0", "\u00e9, Keep-Alive".encode(), True),
    (b"1.1", "\u00e9, CLOSE".encode(), False),
])
def test_the_connection_is_reused_as_its_version_and_connection_field_allow(version, connection, keep) -> None:
    head = b"HTTP/" + version + b" 200 OK\r\nContent-Length: 2"
    if connection is not None:
        head += b"\r\nConnection: " + connection
    small_head._LINES.clear()
    for _ in range(2):  # its lines read anew, then remembered
        got = read_head(head, 2)
        assert got is not None and got.keep is keep
        assert got.version == HttpVersion(1, int(version[-1:]))


def test_a_length_of_small_max_is_read_and_one_more_is_declined() -> None:
    assert read_head(b"HTTP/1.1 200 OK\r\nContent-Length: 100", 100).length == 100  # type: ignore[union-attr]
    assert read_head(b"HTTP/1.1 200 OK\r\nContent-Length: 101", 100) is None


def test_the_names_remembered_stay_bounded_and_read_the_same_once_forgotten() -> None:
    """An origin chooses its field names: a few thousand new ones never grow the memory past its bound."""
    for n in range(3 * small_head._NAMES_MAX):
        got = read_head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-%d: v\r\netag: e" % n, 2)
        assert got is not None and got.pairs == [("Content-Length", "2"), (f"X-{n}", "v"), ("Etag", "e")]
        assert len(small_head._NAMES) <= small_head._NAMES_MAX


def test_a_line_remembered_reads_as_itself_in_any_head_and_the_lines_kept_stay_bounded() -> None:
    """Lines are remembered whatever head they came in: a Content-Length line read in an answer declined
    (two lengths) counts in the next, a Connection line's members are never those of the line before, and an
    origin that sends a new line with every answer never grows the memory past its bound."""
    small_head._LINES.clear()
    assert read_head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2", 2) is None
    got = read_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2", 2)
    assert got is not None and got.keep and got.length == 2
    got = read_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: 2", 2)
    assert got is not None and not got.keep
    got = read_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2", 2)
    assert got is not None and got.keep  # "close" not left among the members remembered
    long_line = b"X-Long: " + b"z" * small_head._LINE_KEPT_MAX
    assert read_head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + long_line, 2) is not None
    assert long_line.decode() not in small_head._LINES  # read, not kept
    for n in range(3 * small_head._LINES_MAX):
        got = read_head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nETag: \"%d\"" % n, 2)
        assert got is not None and got.pairs == [("Content-Length", "2"), ("Etag", f'"{n}"')]
        assert len(small_head._LINES) <= small_head._LINES_MAX


# The whole-head expression read_head checked a head with before it checked its lines one by one (and kept
# those that passed): a head is read exactly where this matches it.
_WHOLE_HEAD = re.compile(rb"HTTP/1\.([01]) 200(?: ([\t\x20-\x7e]*+))?"
                         rb"((?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]++:[\t\x20-\x7e\x80-\xff]*+)*+)")
_PIECES = [b"X-A", b"Server", b"ETag", b"x", b":", b": ", b" ", b"\t", b"v", b"caf\xc3\xa9", b"\xff", b"\x80", b"\x00",
           b"\x01", b"\x1f", b"\x7f", b"\r", b"\n", b"\r\n", b"@", b"(", b"~", b"1", b"HTTP/1.1 200 OK", b"\x0b",
           b"\xc2\x80"]


def test_a_head_is_read_exactly_where_its_status_line_and_every_field_line_match_as_one_expression() -> None:
    """Heads of an accepted status line and a Content-Length, and field lines made of names, separators,
    visible, control and non-ASCII bytes: read (fresh, and again from the lines remembered) exactly where the
    whole-head expression matches, and declined everywhere else; likewise for status lines so made."""
    rng = random.Random(35)
    small_head._LINES.clear()
    heads = []
    for _ in range(3000):
        lines = [b"".join(rng.choices(_PIECES, k=rng.randint(0, 4))) for _ in range(rng.randint(0, 3))]
        heads.append(b"\r\n".join([b"HTTP/1.1 200 OK", b"Content-Length: 2", *lines]))
        status = b"".join(rng.choices([b"HTTP/1.1 200", b"HTTP/1.0 200", b" ", b"OK", b"\t", b"\x7f", b"\xc3\xa9",
                                       b"\r", b"\n", b"2", b"\x00"], k=rng.randint(1, 4)))
        heads.append(status + b"\r\nContent-Length: 2")
    matched = 0
    for head in heads * 2:
        expected = _WHOLE_HEAD.fullmatch(head) is not None
        matched += expected
        assert (read_head(head, 2) is not None) is expected, head
    assert 0 < matched < len(heads) * 2  # both kinds made
