"""What a node asks the owner to revalidate its hot copy, and what the owner's answer means."""

from __future__ import annotations

import pytest

from cachenode.cluster.hot_revalidation import conditional_fields, confirms, owner_expiry

LM = "Wed, 01 Jan 2025 00:00:00 GMT"


@pytest.mark.parametrize("etag, last_modified, client, fields", [
    ('"a"', LM, None, {"If-None-Match": '"a"'}),  # the ETag wins over the date
    ('"a"', None, '"b"', {"If-None-Match": '"a", "b"'}),  # the client's tags travel too
    ('"a"', None, "*", {"If-None-Match": '"a", *'}),
    ('W/"a"', None, None, {"If-None-Match": 'W/"a"'}),
    (None, LM, None, {"If-Modified-Since": LM}),
    (None, LM, '"b"', None),  # the client's If-None-Match would make the owner ignore the date
    (None, None, None, None),  # nothing to revalidate with
])
def test_the_copys_validators_are_asked_with_the_clients_tags(etag, last_modified, client, fields):
    assert conditional_fields(etag=etag, last_modified=last_modified, client_if_none_match=client) == fields


@pytest.mark.parametrize("etag, answer, client, confirmed", [
    ('"a"', '"a"', None, True),
    ('"a"', 'W/"a"', None, True),  # weak comparison, as If-None-Match compares
    ('"a"', '"b"', '"b"', False),  # the 304 is about the client's version, not the copy's
    ('"a"', None, None, True),  # only the copy's tag was asked
    ('"a"', None, '"b"', False),  # either tag could have matched: not proof
    (None, None, None, True),  # asked by date alone
])
def test_only_a_304_about_the_copys_version_renews_it(etag, answer, client, confirmed):
    assert confirms(etag=etag, answer_etag=answer, client_if_none_match=client) is confirmed


@pytest.mark.parametrize("said, expected", [
    ("1700000100.500", 1700000100.5),
    (None, 42.0),
    ("soon", 42.0),
    ("nan", 42.0),
    ("inf", 42.0),
])
def test_the_renewed_copy_expires_when_the_owner_says(said, expected):
    assert owner_expiry(said, fallback=42.0) == expected
