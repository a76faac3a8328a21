"""Which response heads carry an origin's raw bytes (cachenode/front/exact_head.py):
surrogate-escaped octets are found wherever they are, and a plain ASCII value is none."""

from __future__ import annotations

import pytest

from cachenode.front.exact_head import _carries_raw_bytes, encode_head


@pytest.mark.parametrize("text,raw", [
    ("attachment; filename=a.bin", False),
    ("", False),
    ("caf\u00e9", False),  # a real character, not an escaped octet
    (b"caf\xc3\xa9".decode("utf-8", "surrogateescape"), False),  # valid UTF-8 decodes to characters
    (b"\xff".decode("utf-8", "surrogateescape"), True),
    (b"name=\x80x".decode("utf-8", "surrogateescape"), True),
])
def test_raw_octets_are_found_in_a_value_and_ascii_values_carry_none(text, raw):
    assert _carries_raw_bytes(text) is raw


def test_a_head_with_raw_octets_is_encoded_back_to_the_origins_bytes():
    value = b"a\xffb".decode("utf-8", "surrogateescape")
    assert encode_head("HTTP/1.1 200 OK", [("X-Raw", value)]) == b"HTTP/1.1 200 OK\r\nX-Raw: a\xffb\r\n\r\n"
