"""One test per rule of the pure freshness core (cachenode/http/freshness.py),
named for the RFC section it proves. The behaviour-named tables in
test_freshness.py cover the edges; these say which rule each decision is."""

import math

from cachenode.http.freshness import (
    HEURISTIC_TTL, Policy, RequestDirectives, Use, age_of, current_age, judge, may_serve_stale_on_error,
    request_bypasses_cache, request_directives, response_policy,
)

NOW = 1_000_000.0
DATE = "Mon, 12 Jan 1970 13:46:40 GMT"  # == NOW
HOUR_BEFORE = "Mon, 12 Jan 1970 12:46:40 GMT"
HOUR_AFTER = "Mon, 12 Jan 1970 14:46:40 GMT"


def policy(headers, status=200, policy_ttl=None, **kw):
    return response_policy(status, headers, now=NOW, policy_ttl=policy_ttl, **kw)


def stored(now=NOW, *, ttl=60.0, sie=math.inf, swr=0.0, **request):
    """judge() for a copy stored at NOW with `ttl`, asked at `now` with `request` directives."""
    return judge(now=now, stored_at=NOW, expires_at=NOW + ttl, initial_age=0.0, stale_if_error=sie,
                 stale_while_revalidate=swr, request=RequestDirectives(**request))


# -- RFC 9111 §3: storing ------------------------------------------------------

def test_rfc9111_3_a_status_this_cache_does_not_store_is_passed_whatever_its_lifetime():
    assert not policy({"Cache-Control": "max-age=600"}, status=206).storable
    assert not policy({"Cache-Control": "max-age=600"}, status=500).storable


def test_rfc9111_3_a_response_that_sets_a_cookie_is_one_clients_and_not_stored():
    assert policy({"Cache-Control": "max-age=600", "Set-Cookie": "a=b"}).reason == "response sets a cookie"


def test_rfc9111_3_5_a_request_with_credentials_bypasses_the_cache():
    assert request_bypasses_cache({"Authorization": "Bearer x"}) == "request carries Authorization"
    assert request_bypasses_cache({"Accept": "*/*"}) is None


def test_rfc9111_4_1_vary_star_is_never_stored():
    assert policy({"Cache-Control": "max-age=600", "Vary": "Accept, *"}).reason == "Vary: *"


# -- RFC 9111 §4.2.1: the freshness lifetime -----------------------------------

def test_rfc9111_4_2_1_s_maxage_rules_a_shared_cache_before_max_age_and_expires():
    assert policy({"Cache-Control": "max-age=10, s-maxage=20", "Expires": HOUR_AFTER, "Date": DATE}).ttl == 20.0


def test_rfc9111_4_2_1_max_age_rules_before_expires():
    assert policy({"Cache-Control": "max-age=10", "Expires": HOUR_AFTER, "Date": DATE}).ttl == 10.0


def test_rfc9111_4_2_1_expires_counts_from_date():
    assert policy({"Expires": HOUR_AFTER, "Date": HOUR_BEFORE}, policy_ttl=None).ttl == 7200.0 - 3600.0


def test_rfc9111_4_2_1_a_malformed_max_age_is_explicit_and_stale():
    assert policy({"Cache-Control": "max-age=soon", "Last-Modified": HOUR_BEFORE}).ttl == 0.0


def test_rfc9111_1_2_2_a_delta_seconds_beyond_2_to_the_31_counts_as_2_to_the_31():
    assert policy({"Cache-Control": "max-age=99999999999"}).ttl == float(2**31)


# -- RFC 9111 §4.2.2: heuristic freshness --------------------------------------

def test_rfc9111_4_2_2_last_modified_gives_a_heuristic_lifetime_when_none_is_explicit():
    p = policy({"Last-Modified": HOUR_BEFORE})
    assert p.heuristic and p.ttl == HEURISTIC_TTL


def test_rfc9111_4_2_2_the_operators_default_ttl_replaces_the_heuristic():
    p = policy({}, policy_ttl=300.0)
    assert p.heuristic and p.ttl == 300.0


def test_rfc9111_4_2_2_without_lifetime_or_last_modified_a_response_is_stale_at_once():
    assert policy({}).ttl == 0.0


# -- RFC 9111 §4.2.3: age ------------------------------------------------------

def test_rfc9111_4_2_3_the_age_on_arrival_is_the_larger_of_age_and_apparent_age():
    assert current_age({"Age": "30", "Date": HOUR_BEFORE}, NOW) == 3600.0
    assert current_age({"Age": "7200", "Date": HOUR_BEFORE}, NOW) == 7200.0


def test_rfc9111_4_2_3_age_on_arrival_is_taken_off_the_lifetime():
    assert policy({"Cache-Control": "max-age=600", "Age": "100"}).ttl == 500.0


def test_rfc9111_4_2_3_a_reuse_is_as_old_as_its_age_on_arrival_plus_its_time_here():
    assert age_of(now=NOW + 50, stored_at=NOW, initial_age=100.0) == 150.0


# -- RFC 9111 §4.2.4 and RFC 5861: stale responses ------------------------------

def test_rfc9111_4_2_fresh_is_served_and_stale_is_validated():
    assert stored(NOW + 59) is Use.FRESH
    assert stored(NOW + 61) is Use.VALIDATE


def test_rfc9111_4_2_4_a_stale_copy_may_answer_an_origin_failure_when_nothing_forbids_it():
    assert may_serve_stale_on_error(now=NOW + 86400, expires_at=NOW, stale_if_error=math.inf)


def test_rfc5861_4_stale_if_error_bounds_stale_answers_to_failures():
    assert policy({"Cache-Control": "max-age=60, stale-if-error=30"}).stale_if_error == 30.0
    assert not may_serve_stale_on_error(now=NOW + 31, expires_at=NOW, stale_if_error=30.0)


def test_rfc5861_3_stale_while_revalidate_serves_and_revalidates_in_the_background():
    assert stored(NOW + 70, swr=30.0) is Use.STALE_WHILE_REVALIDATE
    assert stored(NOW + 91, swr=30.0) is Use.VALIDATE


# -- RFC 9111 §5.2.2: response directives --------------------------------------

def test_rfc9111_5_2_2_2_must_revalidate_forbids_every_stale_answer():
    p = policy({"Cache-Control": "max-age=60, must-revalidate, stale-if-error=600"})
    assert (p.stale_if_error, p.stale_while_revalidate) == (0.0, 0.0)


def test_rfc9111_5_2_2_8_proxy_revalidate_binds_a_shared_cache_as_must_revalidate():
    assert policy({"Cache-Control": "max-age=60, proxy-revalidate"}).stale_if_error == 0.0


def test_rfc9111_5_2_2_10_s_maxage_implies_proxy_revalidate():
    assert policy({"Cache-Control": "s-maxage=60"}).stale_if_error == 0.0


def test_rfc9111_5_2_2_4_no_cache_stores_but_validates_before_every_reuse():
    assert policy({"Cache-Control": "no-cache, max-age=600"}) == Policy(True, "ok", 0.0, stale_if_error=0.0,
                                                                        stale_while_revalidate=0.0)


def test_rfc9111_5_2_2_5_no_store_is_not_stored():
    assert policy({"Cache-Control": "no-store, max-age=600"}).reason == "Cache-Control: no-store"


def test_rfc9111_5_2_2_7_private_is_not_stored_by_a_shared_cache():
    assert policy({"Cache-Control": "private, max-age=600"}).reason == "Cache-Control: private"


def test_rfc9111_5_2_2_7_private_may_be_stored_where_the_origin_authorises_every_read():
    assert policy({"Cache-Control": "private, max-age=600"}, private_ok=True).storable


# -- RFC 9111 §5.2.1 and §5.4: request directives ------------------------------

def test_rfc9111_5_2_1_4_request_no_cache_validates_even_a_fresh_copy():
    assert stored(NOW + 1, no_cache=True) is Use.VALIDATE


def test_rfc9111_5_2_1_1_request_max_age_validates_a_copy_older_than_it():
    assert stored(NOW + 30, max_age=20.0) is Use.VALIDATE
    assert stored(NOW + 10, max_age=20.0) is Use.FRESH


def test_rfc9111_5_2_1_3_request_min_fresh_validates_a_copy_fresh_for_less():
    assert stored(NOW + 50, min_fresh=20.0) is Use.VALIDATE


def test_rfc9111_5_2_1_2_request_max_stale_accepts_a_stale_copy_but_not_past_must_revalidate():
    assert stored(NOW + 70, max_stale=math.inf) is Use.FRESH
    assert stored(NOW + 70, sie=0.0, max_stale=math.inf) is Use.VALIDATE


def test_rfc9111_5_4_pragma_no_cache_counts_only_without_cache_control():
    assert request_directives({"Pragma": "no-cache"}).no_cache
    assert not request_directives({"Pragma": "no-cache", "Cache-Control": "max-stale"}).no_cache


def test_rfc9111_5_2_1_7_only_if_cached_and_5_2_1_5_no_store_are_read():
    d = request_directives({"Cache-Control": "only-if-cached, no-store"})
    assert d.only_if_cached and d.no_store
