"""The server name of a real ClientHello, whichever way it is cut (cachenode/tls/hello.py)."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachenode.tls.hello import Hello, NotClientHello, alert, read_client_hello


def client_hello(server_name: str | None, *, version: ssl.TLSVersion | None = None) -> bytes:
    """The bytes Python's own TLS client sends first."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if version is not None:
        ctx.maximum_version = version
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def reframe(hello: bytes, record_size: int) -> bytes:
    """The same handshake message split over records of at most `record_size` bytes."""
    message = hello[5:5 + int.from_bytes(hello[3:5], "big")]
    out = b""
    for i in range(0, len(message), record_size):
        chunk = message[i:i + record_size]
        out += bytes([22, 3, 1]) + len(chunk).to_bytes(2, "big") + chunk
    return out


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_the_name_a_client_asks_for_is_read_and_the_hello_measured(version):
    raw = client_hello("Storage.GoogleAPIs.com.", version=version)
    assert read_client_hello(raw + b"more bytes") == Hello("storage.googleapis.com", len(raw))


def test_a_client_without_sni_has_no_name():
    raw = client_hello(None)
    assert read_client_hello(raw) == Hello(None, len(raw))


def test_every_prefix_of_a_hello_asks_for_more():
    raw = client_hello("huggingface.co")
    for cut in range(len(raw)):
        assert read_client_hello(raw[:cut]) is None


@pytest.mark.parametrize("record_size", [1, 7, 100, 512])
def test_a_hello_spread_over_many_records_is_read_whole(record_size):
    raw = reframe(client_hello("images.cocodataset.org"), record_size)
    assert read_client_hello(raw) == Hello("images.cocodataset.org", len(raw))
    assert read_client_hello(raw[:-1]) is None


@pytest.mark.parametrize("raw, reason", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "record type 71"),
    (b"GET", "not a TLS handshake"),
    (bytes([23, 3, 3, 0, 5]) + b"hello", "record type 23"),
    (bytes([22, 2, 0, 0, 5]) + b"hello", "is not TLS"),
    (bytes([22, 3, 1, 0xff, 0xff]), "out of bounds"),
    (bytes([22, 3, 1, 0, 4, 2, 0, 0, 0]), "not a ClientHello"),
    (bytes([22, 3, 1, 0, 6, 1, 0, 0, 2, 3, 3]), "ends inside"),
])
def test_what_is_not_a_client_hello_is_refused_with_a_reason(raw, reason):
    with pytest.raises(NotClientHello, match=reason):
        read_client_hello(raw)


def test_a_hello_claiming_more_than_the_cap_is_refused_before_it_is_buffered():
    with pytest.raises(NotClientHello, match="larger than"):
        read_client_hello(bytes([22, 3, 1, 0, 4, 1, 0x10, 0, 0]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 600))
def test_no_input_makes_the_parser_fail_any_other_way(noise, at):
    raw = bytearray(client_hello("a.example"))
    for i, b in enumerate(noise):
        raw[(at + i) % len(raw)] = b
    try:
        read_client_hello(bytes(raw))
    except NotClientHello:
        pass


def test_the_alert_is_a_fatal_alert_record():
    assert alert(112) == bytes([21, 3, 3, 0, 2, 2, 112])
