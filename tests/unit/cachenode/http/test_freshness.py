import math

import pytest
from multidict import CIMultiDict

from cachenode.http.fields import field_value, http_date, parse_cache_control
from cachenode.http.freshness import (
    HEURISTIC_TTL, STORED_STATUSES, Policy, RequestDirectives, Use, age_of, current_age, judge,
    may_serve_stale_on_error, request_bypasses_cache, request_directives, response_policy,
)

NOW = 1_000_000.0
INF = math.inf
DATE = "Mon, 12 Jan 1970 13:46:40 GMT"  # == NOW
DAY_BEFORE = "Sun, 11 Jan 1970 13:46:40 GMT"  # NOW - 86400
HOUR_BEFORE = "Mon, 12 Jan 1970 12:46:40 GMT"  # NOW - 3600


def multi(*pairs):
    return CIMultiDict(pairs)


@pytest.mark.parametrize("headers,name,value", [
    ({"Cache-Control": "no-cache"}, "Cache-Control", "no-cache"),
    ({"cache-control": "no-cache"}, "Cache-Control", "no-cache"),
    ({"CACHE-CONTROL": "no-cache"}, "cache-control", "no-cache"),
    ({"Vary": ""}, "Vary", ""),
    ({}, "Vary", None),
    (multi(("Cache-Control", "no-cache"), ("cache-control", "max-age=60")), "Cache-Control", "no-cache, max-age=60"),
    (multi(("Vary", "Accept"), ("Other", "x"), ("VARY", "Accept-Encoding")), "vary", "Accept, Accept-Encoding"),
])
def test_field_value_combines_every_line_of_a_field_in_any_case(headers, name, value):
    assert field_value(headers, name) == value


@pytest.mark.parametrize("value,expect", [
    ('max-age=60, No-Cache="Set-Cookie", private', {"max-age": "60", "no-cache": "Set-Cookie", "private": None}),
    ('no-cache="set-cookie, x", max-age=5', {"no-cache": "set-cookie, x", "max-age": "5"}),
    ('private="a\\"b, c", public', {"private": 'a"b, c', "public": None}),
    ("max-age=60, max-age=0", {"max-age": "60"}),
    ("MAX-AGE=0, max-age=60", {"max-age": "0"}),
    ('max-age="30"', {"max-age": "30"}),
    (" , max-age = 30 ,, ", {"max-age": "30"}),
    ("", {}),
    (None, {}),
])
def test_cache_control_directives_are_parsed_with_arguments(value, expect):
    assert parse_cache_control(value) == expect


@pytest.mark.parametrize("value,expect", [
    (DATE, NOW),
    ("  mon, 12 jan 1970 13:46:40 gmt ", NOW),
    ("Monday, 12-Jan-70 13:46:40 GMT", NOW),
    ("Sunday, 06-Nov-94 08:49:37 GMT", 784111777.0),
    ("Tuesday, 06-Nov-07 08:49:37 GMT", 1194338977.0),
    ("Mon Jan 12 13:46:40 1970", NOW),  # asctime names no zone: GMT, not local time
    ("Sun Nov  6 08:49:37 1994", 784111777.0),
    ("Wed, 31 Dec 2008 23:59:60 GMT", 1230767999.0),  # a leap second
    ("0", None), ("-1", None), ("soon", None), ("", None), (None, None),
    ("Mon, 32 Jan 1970 13:46:40 GMT", None),
    ("Mon, 12 Foo 1970 13:46:40 GMT", None),
    ("Mon, 12 Jan 1970 24:00:00 GMT", None),
    ("Mon, 12 Jan 1970 13:46:40", None),  # IMF-fixdate names its zone
    ("Mon, 12 Jan 1970 14:46:40 +0100", None),  # HTTP dates are GMT
    (f"{DATE}, {DATE}", None),  # two Date lines combined
])
def test_http_date_reads_the_three_rfc_9110_formats_or_is_none(value, expect):
    assert http_date(value) == expect


@pytest.mark.parametrize("status,headers,storable,ttl,reason", [
    (200, {}, True, 300.0, "ok"),
    (200, {"Cache-Control": "max-age=60"}, True, 60.0, "ok"),
    (200, {"Cache-Control": "max-age=60, s-maxage=5"}, True, 5.0, "ok"),
    (200, {"Cache-Control": "no-cache"}, True, 0.0, "ok"),
    (200, {"Cache-Control": "max-age=bogus"}, True, 0.0, "ok"),  # invalid freshness: stale (§4.2.1)
    (200, {"Expires": "Mon, 12 Jan 1970 13:46:50 GMT", "Date": DATE}, True, 10.0, "ok"),
    (200, {"Expires": "0"}, True, 0.0, "ok"),
    (200, {"Cache-Control": "no-store"}, False, 0.0, "no-store"),
    (200, {"Cache-Control": "private, max-age=60"}, False, 0.0, "private"),
    (200, {"Vary": "*"}, False, 0.0, "Vary"),
    (200, {"Set-Cookie": "a=b"}, False, 0.0, "cookie"),
    (206, {}, False, 0.0, "status 206"),
    (404, {}, True, 300.0, "ok"),
    (410, {"Cache-Control": "max-age=60"}, True, 60.0, "ok"),
])
def test_response_policy(status, headers, storable, ttl, reason):
    p = response_policy(status, headers, now=NOW, policy_ttl=300.0)
    assert p.storable is storable and p.ttl == ttl and reason in p.reason


@pytest.mark.parametrize("status", [100, 201, 206, 302, 304, 307, 400, 403, 500, 502, 503])
def test_statuses_outside_the_stored_set_are_never_stored(status):
    assert status not in STORED_STATUSES
    assert response_policy(status, {"Cache-Control": "max-age=60"}, now=NOW, policy_ttl=300.0) == Policy(
        False, f"status {status}")


@pytest.mark.parametrize("headers,reason", [
    ({"Cache-Control": "no-store"}, "Cache-Control: no-store"),
    ({"cache-control": "max-age=60, NO-STORE"}, "Cache-Control: no-store"),
    (multi(("Cache-Control", "max-age=60"), ("Cache-Control", "no-store")), "Cache-Control: no-store"),
    ({"Cache-Control": "private"}, "Cache-Control: private"),
    ({"Cache-Control": 'private="x-user, x-id", max-age=60'}, "Cache-Control: private"),
    ({"Vary": "*"}, "Vary: *"),
    ({"Vary": "Accept, *"}, "Vary: *"),
    (multi(("Vary", "Accept"), ("vary", " * ")), "Vary: *"),
    ({"Set-Cookie": "a=b"}, "response sets a cookie"),
    ({"set-cookie": ""}, "response sets a cookie"),
])
def test_responses_for_one_client_are_not_storable(headers, reason):
    assert response_policy(200, headers, now=NOW, policy_ttl=300.0) == Policy(False, reason)


@pytest.mark.parametrize("headers,ttl", [
    ({"Cache-Control": "s-maxage=5, max-age=60"}, 5.0),
    ({"Cache-Control": "s-maxage=x, max-age=60"}, 0.0),  # a malformed s-maxage: stale, not ignored
    ({"Cache-Control": "s-maxage=-5, max-age=60"}, 0.0),
    ({"Cache-Control": "max-age=60", "Expires": "Mon, 12 Jan 1970 13:46:50 GMT", "Date": DATE}, 60.0),
    ({"Cache-Control": "max-age=1.5", "Expires": "Mon, 12 Jan 1970 13:46:50 GMT", "Date": DATE}, 0.0),
    ({"Cache-Control": 'max-age="30"'}, 30.0),
    ({"Cache-Control": "max-age=99999999999999999999999"}, float(2**31)),
    (multi(("Cache-Control", "public"), ("Cache-Control", "max-age=45")), 45.0),
    ({"Expires": "Mon, 12 Jan 1970 13:46:50 GMT"}, 10.0),  # no Date: counted from now
    ({"Expires": "Mon, 12 Jan 1970 13:46:50 GMT", "Date": "yesterday"}, 10.0),
    # Generated 10 s before it arrived: 20 s of lifetime, 10 of them gone (apparent age, §4.2.3).
    ({"expires": "Mon, 12 Jan 1970 13:46:50 GMT", "date": "Mon, 12 Jan 1970 13:46:30 GMT"}, 10.0),
    ({"Expires": "Mon, 12 Jan 1970 13:46:30 GMT", "Date": DATE}, 0.0),
    ({"Expires": "-1"}, 0.0),
    (multi(("Expires", "Mon, 12 Jan 1970 13:46:50 GMT"), ("Expires", "Mon, 12 Jan 1970 13:46:50 GMT")), 0.0),
    ({"Expires": ""}, 0.0),
])
def test_explicit_lifetime_comes_from_s_maxage_then_max_age_then_expires(headers, ttl):
    p = response_policy(200, headers, now=NOW, policy_ttl=300.0)
    assert (p.storable, p.ttl, p.heuristic) == (True, ttl, False)


@pytest.mark.parametrize("headers,ttl", [
    ({"Cache-Control": "max-age=600", "Age": "100"}, 500.0),
    ({"Cache-Control": "s-maxage=60, max-age=600", "Age": "10"}, 50.0),
    ({"Cache-Control": "max-age=60", "Age": "600"}, -540.0),  # stale by 540 s already (stale-if-error counts them)
    ({"Cache-Control": "max-age=60", "Age": "0"}, 60.0),
    ({"Cache-Control": "max-age=60", "age": "bogus"}, 60.0),
    ({"Expires": "Mon, 12 Jan 1970 13:46:50 GMT", "Date": DATE, "Age": "4"}, 6.0),
    ({}, 300.0),  # the node's policy TTL is its own, counted from its store
    ({"Age": "100"}, 300.0),
])
def test_age_is_taken_off_an_explicit_lifetime(headers, ttl):
    assert response_policy(200, headers, now=NOW, policy_ttl=300.0).ttl == ttl


@pytest.mark.parametrize("value,age", [
    (None, 0.0), ("0", 0.0), ("42", 42.0), (" 42 ", 42.0), ("42, 7", 42.0),
    ("-5", 0.0), ("4.5", 0.0), ("soon", 0.0), ("", 0.0), ("\u00b2", 0.0),
])
def test_current_age_is_the_first_non_negative_integer_or_zero(value, age):
    assert current_age({} if value is None else {"Age": value}) == age


def test_current_age_takes_the_first_of_repeated_age_fields():
    assert current_age(multi(("Age", "42"), ("age", "7"))) == 42.0


@pytest.mark.parametrize("cache_control,stale_if_error,stale_while_revalidate", [
    ("max-age=1", INF, 0.0),
    ("max-age=1, stale-if-error=600", 600.0, 0.0),
    ("max-age=1, stale-if-error=0", 0.0, 0.0),
    ("max-age=1, stale-if-error=soon", INF, 0.0),
    ("max-age=1, stale-while-revalidate=30", INF, 30.0),
    ("max-age=1, stale-while-revalidate=-3", INF, 0.0),
    ("max-age=1, stale-while-revalidate=30, stale-if-error=60", 60.0, 30.0),
    ("max-age=1, must-revalidate", 0.0, 0.0),
    ("max-age=1, must-revalidate, stale-if-error=600, stale-while-revalidate=30", 0.0, 0.0),
    ("max-age=1, proxy-revalidate, stale-while-revalidate=30", 0.0, 0.0),
    ("s-maxage=1, stale-if-error=600, stale-while-revalidate=30", 0.0, 0.0),
    ("no-cache, stale-if-error=600, stale-while-revalidate=30", 0.0, 0.0),
    ('no-cache="set-cookie", max-age=60', 0.0, 0.0),
    ("stale-while-revalidate=30", INF, 30.0),  # heuristic freshness keeps the origin's stale allowances
])
def test_stale_allowances_follow_the_revalidation_directives(cache_control, stale_if_error, stale_while_revalidate):
    p = response_policy(200, {"Cache-Control": cache_control}, now=NOW, policy_ttl=None)
    assert (p.stale_if_error, p.stale_while_revalidate) == (stale_if_error, stale_while_revalidate)


@pytest.mark.parametrize("cache_control", ["no-cache", 'no-cache="set-cookie, x"', "max-age=60, no-cache"])
def test_no_cache_is_stored_but_validated_before_every_reuse(cache_control):
    p = response_policy(200, {"Cache-Control": cache_control}, now=NOW, policy_ttl=300.0)
    assert p == Policy(True, "ok", ttl=0.0, stale_if_error=0.0, stale_while_revalidate=0.0, heuristic=False)


@pytest.mark.parametrize("status,headers,policy_ttl,ttl", [
    (200, {}, 300.0, 300.0),
    (200, {"Age": "100"}, 300.0, 300.0),  # policy TTL counts from storing
    (200, {"Last-Modified": DAY_BEFORE}, 300.0, 300.0),  # the operator's policy beats the heuristic
    (200, {"Last-Modified": DAY_BEFORE}, None, HEURISTIC_TTL),
    (200, {"Last-Modified": DAY_BEFORE, "Date": HOUR_BEFORE}, None, 0.0),  # an hour old on arrival
    (200, {"Last-Modified": DAY_BEFORE, "Date": "garbage"}, None, HEURISTIC_TTL),
    (200, {"Last-Modified": DAY_BEFORE, "Age": "640"}, None, HEURISTIC_TTL - 640),
    (200, {"Last-Modified": "Thu, 01 Jan 1970 00:00:00 GMT"}, None, HEURISTIC_TTL),
    (200, {"Last-Modified": "Tue, 13 Jan 1970 13:46:40 GMT"}, None, HEURISTIC_TTL),  # after Date: clock skew
    (200, {"Last-Modified": "garbage"}, None, 0.0),
    (200, {}, None, 0.0),
    (200, {"Cache-Control": "public"}, None, 0.0),
    (200, {"Cache-Control": "public", "Last-Modified": DAY_BEFORE}, None, HEURISTIC_TTL),
    (404, {"Last-Modified": DAY_BEFORE}, None, HEURISTIC_TTL),
    (301, {}, 60.0, 60.0),
    (200, {}, -5.0, 0.0),
])
def test_heuristic_freshness_applies_without_an_explicit_lifetime(status, headers, policy_ttl, ttl):
    p = response_policy(status, headers, now=NOW, policy_ttl=policy_ttl)
    assert (p.storable, p.ttl, p.heuristic) == (True, ttl, True)


@pytest.mark.parametrize("headers", [{"Expires": "0"}, {"Expires": "Mon, 12 Jan 1970 13:46:30 GMT"}])
def test_an_expired_or_invalid_expires_is_explicit_and_beats_the_policy_ttl(headers):
    p = response_policy(200, headers, now=NOW, policy_ttl=300.0)
    assert (p.ttl, p.heuristic) == (0.0, False)


@pytest.mark.parametrize("headers,expect", [
    ({}, RequestDirectives()),
    ({"Cache-Control": "no-cache"}, RequestDirectives(no_cache=True)),
    ({"Pragma": "no-cache"}, RequestDirectives(no_cache=True)),
    ({"pragma": "No-Cache"}, RequestDirectives(no_cache=True)),
    ({"Pragma": "no-cache", "Cache-Control": "max-age=5"}, RequestDirectives(max_age=5.0)),
    ({"Pragma": "no-cache", "Cache-Control": ""}, RequestDirectives()),  # present Cache-Control: Pragma ignored
    ({"Cache-Control": "max-age=0"}, RequestDirectives(max_age=0.0)),
    ({"Cache-Control": "max-age=x"}, RequestDirectives()),
    ({"Cache-Control": "max-stale"}, RequestDirectives(max_stale=INF)),
    ({"Cache-Control": "max-stale=30"}, RequestDirectives(max_stale=30.0)),
    ({"Cache-Control": "max-stale=-1"}, RequestDirectives()),
    ({"Cache-Control": "min-fresh=10"}, RequestDirectives(min_fresh=10.0)),
    ({"Cache-Control": "min-fresh"}, RequestDirectives()),
    ({"cache-control": "ONLY-IF-CACHED, no-store"}, RequestDirectives(only_if_cached=True, no_store=True)),
    (multi(("Cache-Control", "max-age=9"), ("Cache-Control", "no-cache, min-fresh=1")),
     RequestDirectives(no_cache=True, max_age=9.0, min_fresh=1.0)),
])
def test_request_directives(headers, expect):
    assert request_directives(headers) == expect


def rq(**kwargs):
    return RequestDirectives(**kwargs)


# Stored at NOW - 100 with Age 10, expiring at EXPIRES.
STORED_AT, INITIAL_AGE, EXPIRES = NOW - 100, 10.0, NOW + 50


@pytest.mark.parametrize("now,sie,swr,directives,use", [
    (NOW, INF, 0.0, rq(), Use.FRESH),
    (NOW, INF, 0.0, rq(no_cache=True), Use.VALIDATE),
    (NOW, INF, 0.0, rq(max_age=0.0), Use.VALIDATE),
    (NOW, INF, 0.0, rq(max_age=110.0), Use.FRESH),  # age is exactly 110
    (NOW, INF, 0.0, rq(max_age=109.0), Use.VALIDATE),
    (NOW, INF, 0.0, rq(min_fresh=50.0), Use.FRESH),
    (NOW, INF, 0.0, rq(min_fresh=51.0), Use.VALIDATE),
    (EXPIRES - 1, INF, 0.0, rq(), Use.FRESH),
    (EXPIRES, INF, 0.0, rq(), Use.VALIDATE),  # expired at expires_at
    (EXPIRES + 10, INF, 30.0, rq(), Use.STALE_WHILE_REVALIDATE),
    (EXPIRES + 30, INF, 30.0, rq(), Use.VALIDATE),
    (EXPIRES + 10, INF, 0.0, rq(max_stale=10.0), Use.FRESH),
    (EXPIRES + 11, INF, 0.0, rq(max_stale=10.0), Use.VALIDATE),
    (EXPIRES + 11, INF, 30.0, rq(max_stale=10.0), Use.STALE_WHILE_REVALIDATE),
    (EXPIRES + 10**6, INF, 0.0, rq(max_stale=INF), Use.FRESH),
    (EXPIRES + 10, 0.0, 30.0, rq(max_stale=INF), Use.VALIDATE),  # must-revalidate beats the client
    (EXPIRES + 10, 0.0, 30.0, rq(), Use.VALIDATE),
    (EXPIRES + 10, INF, 30.0, rq(max_stale=INF, no_cache=True), Use.VALIDATE),
    (EXPIRES + 10, INF, 30.0, rq(max_stale=INF, max_age=0.0), Use.VALIDATE),
])
def test_judge_weighs_the_stored_policy_against_the_request(now, sie, swr, directives, use):
    assert judge(now=now, stored_at=STORED_AT, expires_at=EXPIRES, initial_age=INITIAL_AGE,
                 stale_if_error=sie, stale_while_revalidate=swr, request=directives) is use


def test_max_age_0_validates_even_a_copy_of_age_0():
    assert judge(now=NOW, stored_at=NOW, expires_at=NOW + 60, initial_age=0.0, stale_if_error=INF,
                 stale_while_revalidate=0.0, request=rq(max_age=0.0)) is Use.VALIDATE


@pytest.mark.parametrize("now,stored_at,initial_age,age", [
    (NOW, NOW, 0.0, 0.0),
    (NOW, NOW - 30, 0.0, 30.0),
    (NOW, NOW - 30, 12.0, 42.0),
    (NOW, NOW + 5, 12.0, 12.0),  # a clock that went back adds nothing
])
def test_age_of_adds_time_stored_here_to_the_age_at_storing(now, stored_at, initial_age, age):
    assert age_of(now=now, stored_at=stored_at, initial_age=initial_age) == age


@pytest.mark.parametrize("now,stale_if_error,allowed", [
    (NOW - 1, INF, True),
    (NOW + 10**9, INF, True),
    (NOW + 60, 60.0, True),
    (NOW + 61, 60.0, False),
    (NOW - 1, 0.0, False),  # must-revalidate: not even a fresh copy stands in for a failed validation
    (NOW + 1, 0.0, False),
])
def test_stale_on_error_is_bounded_by_stale_if_error(now, stale_if_error, allowed):
    assert may_serve_stale_on_error(now=now, expires_at=NOW, stale_if_error=stale_if_error) is allowed


@pytest.mark.parametrize("headers,bypass", [
    ({}, None), ({"Authorization": "Bearer x"}, "Authorization"), ({"Cookie": "a=b"}, "Cookie"),
    ({"authorization": ""}, "Authorization"), (multi(("COOKIE", "a=b")), "Cookie"),
])
def test_credentialed_requests_bypass(headers, bypass):
    got = request_bypasses_cache(headers)
    assert (got is None) if bypass is None else (bypass in got)


@pytest.mark.parametrize("headers,age", [
    ({}, 0.0),
    ({"Date": HOUR_BEFORE}, 3600.0),  # generated an hour before it arrived
    ({"Date": HOUR_BEFORE, "Age": "7200"}, 7200.0),  # the larger of the two
    ({"Date": "Mon, 12 Jan 1970 14:46:40 GMT"}, 0.0),  # a Date in the future is no negative age
    ({"Date": "garbage", "Age": "5"}, 5.0),
])
def test_current_age_on_arrival_is_the_larger_of_age_and_apparent_age(headers, age):
    assert current_age(headers, NOW) == age


@pytest.mark.parametrize("name", ["X-Auth-Token", "Private-Token", "x-api-key", "X-Amz-Security-Token"])
def test_token_fields_bypass_like_authorization(name):
    assert name.lower() in request_bypasses_cache({name: "secret"}).lower()


# -- rules by RFC section (issue 24) ------------------------------------------

FUTURE = "Thu, 18 Aug 2050 02:01:18 GMT"


@pytest.mark.parametrize("expires", [
    "Thu, 18 Aug 2050 02:01:18 UTC",  # the zone is spelt GMT
    "Thu, 18 Aug 2050 02:01:18 AEST",
    "Thu, 18  Aug  2050 02:01:18 GMT",  # one space between parts
    "Thu,  18 Aug 2050 02:01:18 GMT",
    "Thu, 18 Aug 2050  02:01:18 GMT",
    "Thu 18 Aug 2050 02:01:18 GMT",  # no comma
    "18 Aug 2050 02:01:18 GMT",  # no day name
    "Thu, 8 Aug 2050 02:01:18 GMT",  # IMF-fixdate's day has two digits
    "Thu, 18 Aug 50 02:01:18 GMT",  # a two-digit year only in rfc850-date
    "Thu, 18-Aug-2050 02:01:18 GMT",
    "Thu, 18 Aug 2050 02.01.18 GMT",
    "Thu, 18 Aug 2050 2:01:18 GMT",
    "Thursday, 18-Aug-50  02:01:18 GMT",
    "Thu Aug 18 02:01:18 2050 GMT",  # asctime names no zone
    "Thu Aug 8 02:01:18 2050",  # asctime pads a one-digit day with a space
    "0",
])
def test_rfc9111_5_3_an_invalid_expires_means_already_expired(expires):
    """An Expires that is not an HTTP-date is a time in the past, whatever the heuristic would give."""
    assert http_date(expires) is None
    policy = response_policy(200, {"Expires": expires, "Date": DATE, "Last-Modified": DAY_BEFORE},
                             now=NOW, policy_ttl=None)
    assert policy.storable and policy.ttl == 0.0 and not policy.heuristic


@pytest.mark.parametrize("value", [
    FUTURE,
    "thu, 18 aug 2050 02:01:18 gmt",  # case is not checked
    "Thursday, 18-Aug-50 02:01:18 GMT",
    "Thu Aug 18 02:01:18 2050",
])
def test_rfc9110_5_6_7_each_of_the_three_date_formats_is_read(value):
    assert http_date(value) == http_date(FUTURE)


def test_rfc9110_5_6_7_asctime_pads_a_one_digit_day_with_a_space():
    assert http_date("Sun Nov  6 08:49:37 1994") == 784111777.0


def test_rfc9111_4_2_1_a_valid_expires_gives_its_distance_from_date():
    policy = response_policy(200, {"Expires": "Mon, 12 Jan 1970 14:46:40 GMT", "Date": DATE}, now=NOW, policy_ttl=None)
    assert policy.ttl == 3600.0


def test_rfc9111_5_2_2_3_must_understand_stores_a_status_the_cache_understands_despite_no_store():
    policy = response_policy(200, {"Cache-Control": "max-age=3600, no-store, must-understand"}, now=NOW,
                             policy_ttl=None)
    assert policy.storable and policy.ttl == 3600.0


def test_rfc9111_5_2_2_3_must_understand_does_not_store_a_status_the_cache_does_not_understand():
    policy = response_policy(599, {"Cache-Control": "max-age=3600, no-store, must-understand"}, now=NOW,
                             policy_ttl=None)
    assert not policy.storable


def test_rfc9111_5_2_2_5_no_store_without_must_understand_is_not_stored():
    assert not response_policy(200, {"Cache-Control": "max-age=3600, no-store"}, now=NOW, policy_ttl=None).storable


TARGETED = ("Nezha-Cache-Control", "CDN-Cache-Control")


@pytest.mark.parametrize("headers,storable,ttl", [
    # The targeted field replaces Cache-Control ...
    ({"Cache-Control": "no-store", "CDN-Cache-Control": "max-age=10000"}, True, 10000.0),
    ({"Cache-Control": "max-age=10000", "CDN-Cache-Control": "no-store"}, False, 0.0),
    ({"Cache-Control": "max-age=3600", "CDN-Cache-Control": "max-age=1"}, True, 1.0),
    ({"Cache-Control": "max-age=1", "CDN-Cache-Control": "max-age=3600"}, True, 3600.0),
    # ... and Expires, valid or not.
    ({"CDN-Cache-Control": "max-age=0", "Expires": FUTURE, "Date": DATE}, True, 0.0),
    ({"CDN-Cache-Control": "max-age=3600", "Expires": DAY_BEFORE, "Date": DATE}, True, 3600.0),
    ({"CDN-Cache-Control": "max-age=3600", "Expires": "0", "Date": DATE}, True, 3600.0),
    # Age still counts (§4.2.3): older than its targeted lifetime is stale on arrival.
    ({"CDN-Cache-Control": "max-age=3600", "Age": "7200", "Date": DATE}, True, -3600.0),
    # A delta-seconds beyond 2^31 counts as 2^31 (RFC 9111 §1.2.2).
    ({"CDN-Cache-Control": "max-age=99999999999"}, True, float(2**31)),
])
def test_rfc9213_2_1_a_targeted_field_replaces_cache_control_and_expires(headers, storable, ttl):
    policy = response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED)
    assert (policy.storable, policy.ttl) == (storable, ttl)


def test_rfc9213_2_1_targeted_private_is_not_stored_however_fresh_cache_control_says_it_is():
    headers = {"CDN-Cache-Control": "private", "Cache-Control": "max-age=10000", "Expires": FUTURE, "Date": DATE}
    policy = response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED)
    assert (policy.storable, policy.reason) == (False, "CDN-Cache-Control: private")


def test_rfc9213_2_1_targeted_no_cache_validates_every_reuse():
    headers = {"CDN-Cache-Control": "no-cache", "Cache-Control": "max-age=10000", "Expires": FUTURE, "Date": DATE}
    policy = response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED)
    assert policy == Policy(True, "ok", 0.0, stale_if_error=0.0, stale_while_revalidate=0.0)


def test_rfc9213_2_1_the_first_field_of_the_list_wins():
    headers = {"CDN-Cache-Control": "max-age=60", "Nezha-Cache-Control": "max-age=86400",
               "Cache-Control": "no-store"}
    assert response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED).ttl == 86400.0
    assert response_policy(200, headers, now=NOW, policy_ttl=None,
                           targeted=("CDN-Cache-Control", "Nezha-Cache-Control")).ttl == 60.0


@pytest.mark.parametrize("nezha", [
    "max-age=86400, &&&&&",  # not a Dictionary
    "MaX-aGe=86400",  # Dictionary keys are lowercase
    "max-age =86400",
    "",  # empty
])
def test_rfc9213_2_1_an_invalid_or_empty_targeted_field_is_ignored_and_the_next_one_rules(nezha):
    headers = {"Nezha-Cache-Control": nezha, "CDN-Cache-Control": "max-age=60", "Cache-Control": "no-store"}
    assert response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED).ttl == 60.0
    del headers["CDN-Cache-Control"]
    policy = response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED)
    assert (policy.storable, policy.reason) == (False, "Cache-Control: no-store")


@pytest.mark.parametrize("value", ['max-age="10000"', "max-age=-1", "max-age=1.5", "max-age", "max-age=ten"])
def test_rfc9213_2_1_a_targeted_max_age_that_is_no_non_negative_integer_is_malformed_so_stale(value):
    policy = response_policy(200, {"CDN-Cache-Control": value, "Cache-Control": "max-age=10000"}, now=NOW,
                             policy_ttl=None, targeted=TARGETED)
    assert policy.storable and policy.ttl == 0.0


def test_rfc9213_2_1_a_targeted_field_without_a_lifetime_leaves_the_heuristic():
    headers = {"CDN-Cache-Control": "public", "Expires": FUTURE, "Date": DATE, "Last-Modified": DAY_BEFORE}
    policy = response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED)
    assert policy.heuristic and policy.ttl == HEURISTIC_TTL


def test_rfc9213_2_1_targeted_revalidation_directives_bound_stale_answers():
    headers = {"CDN-Cache-Control": "max-age=60, must-revalidate", "Cache-Control": "max-age=60, stale-if-error=600"}
    policy = response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED)
    assert (policy.stale_if_error, policy.stale_while_revalidate) == (0.0, 0.0)
    headers = {"CDN-Cache-Control": "max-age=60, stale-if-error=600, stale-while-revalidate=30"}
    policy = response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED)
    assert (policy.stale_if_error, policy.stale_while_revalidate) == (600.0, 30.0)


def test_rfc9213_2_1_with_no_targeted_field_configured_cache_control_rules():
    headers = {"Cache-Control": "no-store", "CDN-Cache-Control": "max-age=10000"}
    assert not response_policy(200, headers, now=NOW, policy_ttl=None).storable


def test_rfc9213_2_1_repeated_lines_of_a_targeted_field_are_one_dictionary():
    headers = multi(("CDN-Cache-Control", "public"), ("Cache-Control", "no-store"), ("cdn-cache-control", "max-age=90"))
    assert response_policy(200, headers, now=NOW, policy_ttl=None, targeted=TARGETED).ttl == 90.0


@pytest.mark.parametrize("stamp,text", [
    (NOW, DATE), (NOW + 0.9, DATE), (784111777.0, "Sun, 06 Nov 1994 08:49:37 GMT"),
    (0.0, "Thu, 01 Jan 1970 00:00:00 GMT"),
])
def test_rfc9110_5_6_7_a_date_the_cache_generates_is_an_imf_fixdate(stamp, text):
    from cachenode.http.fields import imf_fixdate

    assert imf_fixdate(stamp) == text and http_date(text) == float(int(stamp))


def test_a_request_carrying_several_credentials_names_the_first_in_the_fixed_order_whatever_its_own():
    headers = multi(("X-Api-Key", "k"), ("cookie", "a=b"), ("Authorization", "Bearer t"))
    assert request_bypasses_cache(headers) == "request carries Authorization"
    assert request_bypasses_cache(multi(("X-Api-Key", "k"), ("COOKIE", "a=b"))) == "request carries Cookie"


def test_an_http_date_read_again_is_the_same_timestamp_and_an_invalid_one_stays_none():
    assert http_date(DATE) == http_date(DATE) == NOW
    assert http_date("garbage") is None and http_date("garbage") is None


def test_an_age_the_caller_worked_out_is_the_one_taken_off_the_lifetime():
    """A fill's leader works out the answer's Age once (fill/engine.py `_judge`) and hands it in:
    the same policy as the one working it out itself, and the age given is what counts."""
    now = 1_700_000_000.0
    for headers in ({"Cache-Control": "max-age=600", "Age": "100"},
                    {"Last-Modified": "Sun, 06 Nov 1994 08:49:37 GMT", "Age": "30"}):
        itself = response_policy(200, headers, now=now, policy_ttl=None)
        assert response_policy(200, headers, now=now, policy_ttl=None, age=current_age(headers, now)) == itself
        assert response_policy(200, headers, now=now, policy_ttl=None, age=0.0).ttl == itself.ttl + float(
            headers["Age"])
