"""A field sent on several lines is one list (RFC 9110 §5.3), wherever the cache reads it.

Issue 14: `Cache-Control: max-age=3600` plus a second line `Cache-Control:
private` was stored and served to everyone, because only the first line
was read. Every reader that decides storage or reuse (freshness.py, vary.py,
headers.py) must see the same list whether the sender put its members on one
line or several; the property tests split the same members over any lines.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from cachenode.http.freshness import RequestDirectives, request_directives, response_policy
from cachenode.http.headers import connection_listed
from cachenode.http.vary import variant, vary_names

NOW = 1_000_000.0


def lines(*pairs):
    """Headers as a parser hands them over: a read-only multidict, repeats in order."""
    return CIMultiDictProxy(CIMultiDict(pairs))


@pytest.mark.parametrize("pairs,reason", [
    ([("Cache-Control", "max-age=3600"), ("Cache-Control", "private")], "Cache-Control: private"),
    ([("Cache-Control", "max-age=3600"), ("cache-control", "no-store")], "Cache-Control: no-store"),
    ([("Cache-Control", "max-age=3600"), ("Vary", "Accept-Encoding"), ("Vary", "*")], "Vary: *"),
    ([("Cache-Control", "max-age=3600"), ("Vary", "Accept-Encoding, *")], "Vary: *"),
    ([("Cache-Control", "max-age=3600"), ("Vary", "Accept-Encoding"), ("VARY", " *")], "Vary: *"),
    ([("Cache-Control", "max-age=3600"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")], "response sets a cookie"),
])
def test_a_second_line_that_makes_a_response_private_is_never_missed(pairs, reason):
    """The issue's own examples: what the later line says counts as if it were on the first."""
    policy = response_policy(200, lines(*pairs), now=NOW, policy_ttl=None)
    assert not policy.storable and policy.reason == reason


@pytest.mark.parametrize("pairs", [
    [("Vary", "Accept-Encoding"), ("Vary", "*")],
    [("Vary", "Accept-Encoding, *")],
    [("Vary", "Accept-Encoding"), ("Vary", "Origin, *")],
])
def test_a_star_on_any_vary_line_means_no_request_is_ever_matched(pairs):
    """RFC 9111 §4.1: Vary with `*` among its members never matches; None is "never reuse"."""
    assert vary_names(lines(*pairs)) is None


def test_vary_names_on_every_line_select_the_variant():
    """A response varying on two fields named on two lines varies on both."""
    names = vary_names(lines(("Vary", "Accept-Encoding"), ("Vary", "Accept-Language")))
    assert names == ("accept-encoding", "accept-language")
    french = variant(names, {"Accept-Encoding": "gzip", "Accept-Language": "fr"})
    german = variant(names, {"Accept-Encoding": "gzip", "Accept-Language": "de"})
    assert french != german


def test_a_request_field_on_two_lines_selects_the_same_variant_as_on_one():
    """Accept-Encoding: gzip + Accept-Encoding: br is the request `Accept-Encoding: gzip, br`."""
    names = ("accept-encoding",)
    assert variant(names, lines(("Accept-Encoding", "gzip"), ("Accept-Encoding", "br"))) == variant(
        names, {"Accept-Encoding": "gzip, br"})


@pytest.mark.parametrize("pairs,expect", [
    ([("Cache-Control", "max-stale"), ("Cache-Control", "no-cache")], RequestDirectives(no_cache=True,
                                                                                          max_stale=float("inf"))),
    ([("Cache-Control", "max-age=60"), ("Cache-Control", "only-if-cached")],
     RequestDirectives(max_age=60.0, only_if_cached=True)),
    ([("Cache-Control", "max-age=60"), ("Cache-Control", "no-store")], RequestDirectives(max_age=60.0, no_store=True)),
    ([("Pragma", "x-custom"), ("Pragma", "no-cache")], RequestDirectives(no_cache=True)),
])
def test_a_clients_directives_on_a_second_line_count(pairs, expect):
    """RFC 9111 §5.2.1 and §5.4 on the request side: `no-cache` on line two still forces validation."""
    assert request_directives(lines(*pairs)) == expect


def test_every_connection_line_names_hop_by_hop_fields():
    """RFC 9110 §7.6.1: a field named on the second Connection line is dropped too."""
    assert connection_listed(lines(("Connection", "keep-alive"), ("Connection", "X-Secret, x-other"))) == {
        "keep-alive", "x-secret", "x-other"}


DIRECTIVES = ["max-age=3600", "s-maxage=60", "private", "no-store", "no-cache", "public", "must-revalidate",
              "stale-if-error=30", "stale-while-revalidate=10", 'private="x-a, x-b"', "max-age=0"]


def split(members: list[str], cuts: list[bool]) -> list[str]:
    """`members` as field lines, a new line wherever `cuts` says."""
    out = [members[0]]
    for member, cut in zip(members[1:], cuts):
        if cut:
            out.append(member)
        else:
            out[-1] += ", " + member
    return out


@given(st.lists(st.sampled_from(DIRECTIVES), min_size=1, max_size=6), st.data())
def test_response_policy_does_not_depend_on_how_cache_control_is_split_into_lines(members, data):
    """Any split of the same members over lines stores, or refuses, alike and for as long."""
    cuts = data.draw(st.lists(st.booleans(), min_size=len(members) - 1, max_size=len(members) - 1))
    one = response_policy(200, {"Cache-Control": ", ".join(members), "ETag": '"e"'}, now=NOW, policy_ttl=None)
    many = response_policy(200, lines(("ETag", '"e"'), *(("Cache-Control", v) for v in split(members, cuts))),
                           now=NOW, policy_ttl=None)
    assert many == one


VARY_MEMBERS = ["Accept-Encoding", "Accept", "Origin", "*", "accept-encoding"]


@given(st.lists(st.sampled_from(VARY_MEMBERS), min_size=1, max_size=5), st.data())
def test_vary_names_do_not_depend_on_how_vary_is_split_into_lines(members, data):
    """Any split of the same Vary members names the same fields, or the same `*`."""
    cuts = data.draw(st.lists(st.booleans(), min_size=len(members) - 1, max_size=len(members) - 1))
    assert vary_names(lines(*(("Vary", v) for v in split(members, cuts)))) == vary_names(
        {"Vary": ", ".join(members)})


REQUEST_DIRECTIVES = ["max-age=5", "max-stale", "max-stale=9", "min-fresh=3", "no-cache", "no-store",
                      "only-if-cached"]


@given(st.lists(st.sampled_from(REQUEST_DIRECTIVES), min_size=1, max_size=5), st.data())
def test_request_directives_do_not_depend_on_how_cache_control_is_split_into_lines(members, data):
    """The client's side: the same members over any lines ask the same of the cache."""
    cuts = data.draw(st.lists(st.booleans(), min_size=len(members) - 1, max_size=len(members) - 1))
    assert request_directives(lines(*(("Cache-Control", v) for v in split(members, cuts)))) == request_directives(
        {"Cache-Control": ", ".join(members)})
