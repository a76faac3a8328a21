import pytest

from cachenode.freshness import current_age, parse_cache_control, request_bypasses_cache, response_policy

NOW = 1_000_000.0


def test_cache_control_directives_are_parsed_with_arguments():
    assert parse_cache_control('max-age=60, No-Cache="Set-Cookie", private') == {
        "max-age": "60", "no-cache": "Set-Cookie", "private": None}


@pytest.mark.parametrize("status,headers,storable,ttl,reason", [
    (200, {}, True, 300.0, "ok"),
    (200, {"Cache-Control": "max-age=60"}, True, 60.0, "ok"),
    (200, {"Cache-Control": "max-age=60, s-maxage=5"}, True, 5.0, "ok"),
    (200, {"Cache-Control": "no-cache"}, True, 0.0, "ok"),
    (200, {"Cache-Control": "max-age=bogus"}, True, 300.0, "ok"),
    (200, {"Expires": "Mon, 12 Jan 1970 13:46:50 GMT", "Date": "Mon, 12 Jan 1970 13:46:40 GMT"}, True, 10.0, "ok"),
    (200, {"Expires": "0"}, True, 0.0, "ok"),
    (200, {"Cache-Control": "no-store"}, False, 0.0, "no-store"),
    (200, {"Cache-Control": "private, max-age=60"}, False, 0.0, "private"),
    (200, {"Vary": "*"}, False, 0.0, "Vary"),
    (200, {"Set-Cookie": "a=b"}, False, 0.0, "cookie"),
    (206, {}, False, 0.0, "status 206"),
    (404, {}, False, 0.0, "status 404"),
])
def test_response_policy(status, headers, storable, ttl, reason):
    p = response_policy(status, headers, default_ttl=300.0, now=NOW)
    assert p.storable is storable and p.ttl == ttl and reason in p.reason


@pytest.mark.parametrize("headers,ttl", [
    ({"Cache-Control": "max-age=600", "Age": "100"}, 500.0),
    ({"Cache-Control": "s-maxage=60, max-age=600", "Age": "10"}, 50.0),
    ({"Cache-Control": "max-age=60", "Age": "600"}, 0.0),
    ({"Cache-Control": "max-age=60", "Age": "0"}, 60.0),
    ({"Expires": "Mon, 12 Jan 1970 13:46:50 GMT", "Date": "Mon, 12 Jan 1970 13:46:40 GMT", "Age": "4"}, 6.0),
    ({}, 300.0),  # the node's default TTL is its own policy, counted from its store
    ({"Age": "100"}, 300.0),
])
def test_age_is_taken_off_an_explicit_lifetime(headers, ttl):
    assert response_policy(200, headers, default_ttl=300.0, now=NOW).ttl == ttl


@pytest.mark.parametrize("value,age", [
    (None, 0.0), ("0", 0.0), ("42", 42.0), (" 42 ", 42.0), ("42, 7", 42.0),
    ("-5", 0.0), ("4.5", 0.0), ("soon", 0.0), ("", 0.0), ("\u00b2", 0.0),
])
def test_current_age_is_the_first_non_negative_integer_or_zero(value, age):
    assert current_age({} if value is None else {"Age": value}) == age


def test_must_revalidate_forbids_stale_on_error():
    assert response_policy(200, {"Cache-Control": "max-age=1, must-revalidate"}, default_ttl=1, now=NOW).stale_if_error is False
    assert response_policy(200, {"Cache-Control": "max-age=1"}, default_ttl=1, now=NOW).stale_if_error is True


@pytest.mark.parametrize("headers,bypass", [
    ({}, None), ({"Authorization": "Bearer x"}, "Authorization"), ({"Cookie": "a=b"}, "Cookie"),
])
def test_credentialed_requests_bypass(headers, bypass):
    got = request_bypasses_cache(headers)
    assert (got is None) if bypass is None else (bypass in got)
