"""Which fields a stored response keeps, and its Date (RFC 9110 §6.6.1, RFC 9111 §3.1, §3.2)."""

from cachenode.http.headers import stored_pairs, updated_by_304, with_date

DATE = "Mon, 12 Jan 1970 13:46:40 GMT"  # 1_000_000


def test_rfc9111_3_1_a_stored_response_keeps_every_end_to_end_field_set_cookie2_included():
    pairs = [("Content-Type", "text/plain"), ("Set-Cookie2", "a=c"), ("X-Any", "1"), ("X-Any", "2")]
    assert stored_pairs(pairs) == tuple(pairs)


def test_rfc9111_3_a_set_cookie_and_age_are_not_stored():
    assert stored_pairs([("Set-Cookie", "a=b"), ("Age", "10"), ("ETag", '"x"')]) == (("ETag", '"x"'),)


def test_rfc9110_6_6_1_date_is_stored_where_the_origin_put_it():
    pairs = [("Content-Type", "text/plain"), ("Date", DATE), ("ETag", '"x"')]
    assert stored_pairs(pairs) == tuple(pairs)


def test_rfc9110_6_6_1_a_response_without_date_is_dated_when_received():
    assert with_date((("ETag", '"x"'),), 1_000_000.0) == (("ETag", '"x"'), ("Date", DATE))


def test_rfc9110_6_6_1_a_response_with_date_keeps_it():
    pairs = (("date", "Sun, 11 Jan 1970 13:46:40 GMT"),)
    assert with_date(pairs, 1_000_000.0) == pairs


def test_rfc9111_4_3_4_a_304s_date_replaces_the_stored_one():
    stored = (("Date", "Sun, 11 Jan 1970 13:46:40 GMT"), ("ETag", '"x"'))
    assert updated_by_304(stored, [("Date", DATE), ("Age", "3")]) == (("ETag", '"x"'), ("Date", DATE))


def test_a_304_renews_the_stored_fields_and_its_age_and_date_date_the_lifetime_it_grants():
    from cachenode.http.headers import renewed_by_304

    now = 1_780_000_000.0
    stored = (("Content-Type", "application/x-tar"), ("Cache-Control", "max-age=60"), ("ETag", '"v1"'))
    answer = (("Cache-Control", "max-age=600"), ("Cache-Control", "must-revalidate"), ("Age", "100"),
              ("Content-Length", "0"))
    merged, policy = renewed_by_304(200, stored, answer, now=now, policy_ttl=None)
    # Both Cache-Control lines replace the stored one; the 304's own length is not the object's.
    assert merged[:2] == (("Content-Type", "application/x-tar"), ("ETag", '"v1"'))
    assert ("Cache-Control", "max-age=600") in merged and ("Cache-Control", "must-revalidate") in merged
    assert ("Content-Length", "0") not in merged
    assert policy.storable and policy.ttl == 500  # max-age less the 304's Age


def test_a_304_that_makes_the_response_private_leaves_it_unstorable():
    from cachenode.http.headers import renewed_by_304

    stored = (("Cache-Control", "max-age=60"), ("ETag", '"v1"'))
    _, policy = renewed_by_304(200, stored, (("Cache-Control", "private"),), now=1_780_000_000.0, policy_ttl=None)
    assert not policy.storable


def test_the_fields_left_out_are_each_messages_own_though_the_sets_are_remembered():
    """end_to_end_pairs and stored_pairs remember the set of names a message
    leaves out, by its Connection and the reader's drop: one message's
    Connection or drop must never leave out another's fields."""
    from cachenode.http.headers import end_to_end_pairs

    first = [("Connection", "X-Hop"), ("X-Hop", "1"), ("X-Kept", "2"), ("Proxy-Authenticate", "Basic"),
             ("X-Nezha-Cache", "hit"), ("Age", "3")]
    second = [("Connection", "X-Kept"), ("X-Hop", "1"), ("X-Kept", "2")]
    assert stored_pairs(first) == (("X-Kept", "2"),)
    assert stored_pairs(second) == (("X-Hop", "1"),)
    assert stored_pairs(first) == (("X-Kept", "2"),)
    assert end_to_end_pairs(first) == [("X-Kept", "2"), ("X-Nezha-Cache", "hit"), ("Age", "3")]
    assert end_to_end_pairs(first, drop=frozenset({"age"})) == [("X-Kept", "2"), ("X-Nezha-Cache", "hit")]
    assert end_to_end_pairs(first, drop={"x-kept"}) == [("X-Nezha-Cache", "hit"), ("Age", "3")]  # any set
    assert end_to_end_pairs(first) == [("X-Kept", "2"), ("X-Nezha-Cache", "hit"), ("Age", "3")]
