"""The head of a body-less GET the origin client writes itself
(cachenode/fill/plain_get.py): the fields a session would send, in its
order, and which requests may be written that way."""

from __future__ import annotations

import pytest
from aiohttp import ClientTimeout
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from cachenode.fill import plain_get
from cachenode.fill.plain_get import plain, plain_request, request_fields, request_head


def fields_of(url: str, headers) -> list[tuple[str, str]]:
    return list(request_fields(URL(url, encoded=True), headers).items())


def test_host_comes_first_then_the_callers_fields_in_order_then_accept():
    got = fields_of("http://origin.example:8080/a", CIMultiDict([("Via", "1.1 n"), ("X-B", "2"), ("X-A", "1")]))
    assert got == [("Host", "origin.example:8080"), ("Via", "1.1 n"), ("X-B", "2"), ("X-A", "1"), ("Accept", "*/*")]


def test_a_default_port_is_left_out_of_host():
    assert fields_of("http://origin.example/a", {})[0] == ("Host", "origin.example")
    assert fields_of("https://origin.example:443/a", {})[0] == ("Host", "origin.example")
    assert fields_of("https://[::1]:8443/a", {})[0] == ("Host", "[::1]:8443")


def test_a_callers_accept_replaces_the_default_one_and_no_agent_or_encoding_is_added():
    got = fields_of("http://o/a", {"accept": "image/*"})
    assert got == [("Host", "o"), ("accept", "image/*")]
    assert not any(n.lower() in ("user-agent", "accept-encoding", "cookie", "connection") for n, _ in got)


def test_a_callers_host_takes_the_place_of_the_urls():
    assert fields_of("http://parent:8080/a", CIMultiDict([("X-A", "1"), ("Host", "images.example")])) == [
        ("Host", "images.example"), ("X-A", "1"), ("Accept", "*/*")]


def test_repeated_fields_are_all_sent_in_order():
    got = fields_of("http://o/a", CIMultiDict([("X-A", "1"), ("X-B", "b"), ("X-A", "2")]))
    assert got == [("Host", "o"), ("X-A", "1"), ("X-B", "b"), ("X-A", "2"), ("Accept", "*/*")]


def test_the_target_goes_out_as_the_client_spelt_it():
    url = URL("http://o/a%27b/%28c%29?x=%2F&y=1", encoded=True)
    head = request_head(url, request_fields(url, {}))
    assert head == b"GET /a%27b/%28c%29?x=%2F&y=1 HTTP/1.1\r\nHost: o\r\nAccept: */*\r\n\r\n"


def test_a_control_character_in_a_field_is_refused_before_anything_is_sent():
    url = URL("http://o/a", encoded=True)
    with pytest.raises(ValueError, match="Forbidden control character"):
        request_head(url, request_fields(url, {"X-A": "1\r\nX-Injected: 2"}))


@pytest.mark.parametrize("url, timeout, expected", [
    ("http://o/a", ClientTimeout(total=None, sock_read=5), True),
    ("https://o:8443/a?b", ClientTimeout(total=None, connect=3), True),
    ("http://user:secret@o/a", ClientTimeout(total=None), False),  # a session sends it as Authorization
    ("http://user@o/a", ClientTimeout(total=None), False),
    ("http://o/a", ClientTimeout(total=30), False),  # a session bounds the whole exchange
    ("ftp://o/a", ClientTimeout(total=None), False),
])
def test_only_a_url_without_credentials_and_no_total_timeout_is_written_plainly(url, timeout, expected):
    assert plain(URL(url, encoded=True), timeout) is expected


def written_as_before(url: str, fields, timeout: ClientTimeout):
    """What the small gets' caller sent before `plain_request`: yarl's URL, `plain`, `request_head` of a copy
    of the fields (front/fast_misses.py `FastMisses._small_get`)."""
    asked = URL(url, encoded=True)
    if not plain(asked, timeout) or asked.raw_host is None or asked.port is None:
        return None
    return asked.raw_host, asked.port, request_head(asked, request_fields(asked, CIMultiDict(fields)))


def outcome(call, *args):
    try:
        return call(*args)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return type(e), str(e)


URLS = [f"http://{authority}{target}" for authority in (
    "origin.example", "origin.example:8080", "Origin.Example:80", "127.0.0.1:9000", "[::1]:8443", "user@o",
    "user:pw@o:81", "o:99999", "o:x", "o?q", "o#f", "o\tx:81", "o\nx:81", "") for target in (
    "/", "/a/b.bin", "/a?x=1&y", "/p?", "/p??", "/a/../b", "//x", "/a%27b/%28c%29", "/a b", "/a#frag",
    "/caf\u00e9", "/a\tb", "/a\x01b", "/a\x7fb", "/?", "/x?y?z", "/\\x", "/a\nb", "/a\x1f", "/~!\"$\x7e", "")] + [
    "http://o", "http://o?x", "https://o/a", "HTTP://o/a", "http:/o/a", "ftp://o/a"]
FIELDS = [{}, CIMultiDict([("Via", "1.1 n")]), CIMultiDict([("Via", "1.1 n"), ("X-A", "1"), ("x-a", "2")]),
          CIMultiDict([("Host", "images.example"), ("Accept", "image/*")]), {"X-A": "1\r\nX-Injected: 2"},
          CIMultiDictProxy(CIMultiDict([("Via", "1.1 n"), ("accept", "a/b"), ("X-A", "1"), ("x-A", "2")]))]


@pytest.mark.parametrize("fields", FIELDS)
@pytest.mark.parametrize("timeout", [ClientTimeout(total=None, sock_read=5), ClientTimeout(total=30)])
def test_a_plain_request_is_what_yarl_and_request_head_make_of_it_every_time(fields, timeout, monkeypatch):
    """Host, port and head byte for byte, or None, or the same error: asked first and again, remembered."""
    monkeypatch.setattr(plain_get, "_WHERE", {})
    for url in URLS + URLS:
        assert outcome(plain_request, url, fields, timeout) == outcome(written_as_before, url, fields, timeout), url


def test_an_origins_fields_are_written_once_for_its_targets(monkeypatch):
    monkeypatch.setattr(plain_get, "_WHERE", {})
    via = CIMultiDict([("Via", "1.1 n")])
    for n in range(3):
        assert plain_request(f"http://o:81/f/{n}", via, ClientTimeout(total=None)) == (
            "o", 81, b"GET /f/%d HTTP/1.1\r\nHost: o:81\r\nVia: 1.1 n\r\nAccept: */*\r\n\r\n" % n)
    assert list(plain_get._WHERE) == [("o:81", (("Via", "1.1 n"),))]


def test_the_origins_remembered_stay_bounded(monkeypatch):
    monkeypatch.setattr(plain_get, "_WHERE", {})
    for n in range(3 * plain_get._WHERE_MAX):
        assert plain_request(f"http://o{n}/a", {}, ClientTimeout(total=None)) == (
            f"o{n}", 80, b"GET /a HTTP/1.1\r\nHost: o%d\r\nAccept: */*\r\n\r\n" % n)
        assert len(plain_get._WHERE) <= plain_get._WHERE_MAX


def test_fields_too_long_to_remember_are_written_every_time_all_the_same(monkeypatch):
    """A client whose User-Agent is new on every request and kilobytes long pins nothing: each such
    request is written as yarl and request_head write it, and none is remembered."""
    monkeypatch.setattr(plain_get, "_WHERE", {})
    for n in range(20):
        fields = CIMultiDict([("Via", "1.1 n"), ("User-Agent", f"{n}" + "x" * plain_get._WHERE_ENTRY_MAX)])
        url = f"http://o:81/f/{n}"
        got = plain_request(url, fields, ClientTimeout(total=None))
        assert got == outcome(written_as_before, url, fields, ClientTimeout(total=None))
    assert plain_get._WHERE == {}
