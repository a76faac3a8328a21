"""Directives read once and remembered by their value read as they read afresh, and each reader gets its own."""

import pytest

from cachenode.http import fields, targeted
from cachenode.http.fields import parse_cache_control
from cachenode.http.targeted import targeted_directives

CACHE_CONTROLS = ["public, max-age=86400", 'no-cache="set-cookie, x", private', "max-age=60, max-age=5",
                  "MAX-AGE=7, , s-maxage=\"9\"", "no-store", ",", "stale-if-error=60, must-revalidate"]
TARGETED = ["max-age=600", "no-store", 'max-age="60"', "not a dictionary;;", "", "private, max-age=5",
            "stale-if-error=3, a=?0", "max-age=1.5"]


@pytest.mark.parametrize("value", CACHE_CONTROLS)
def test_a_remembered_cache_control_reads_as_afresh_and_is_the_readers_own(value):
    fields._DIRECTIVES.clear()
    afresh = parse_cache_control(value)
    remembered = parse_cache_control(value)
    assert remembered == afresh and remembered is not afresh
    remembered["no-store"] = None  # one reader's change reaches no other
    assert parse_cache_control(value) == afresh


@pytest.mark.parametrize("value", TARGETED)
def test_a_remembered_targeted_field_reads_as_afresh_and_is_the_readers_own(value):
    headers = {"CDN-Cache-Control": value, "Cache-Control": "max-age=1"}
    targeted._directives.clear()
    afresh = targeted_directives(headers, ("CDN-Cache-Control",))
    remembered = targeted_directives(headers, ("CDN-Cache-Control",))
    assert remembered == afresh
    if afresh is not None:
        assert remembered[1] is not afresh[1]
        remembered[1]["no-store"] = None
        assert targeted_directives(headers, ("CDN-Cache-Control",)) == afresh


def test_the_values_remembered_are_bounded():
    for i in range(fields._DIRECTIVES_KEPT * 2):
        parse_cache_control(f"max-age={i}")
        targeted_directives({"CDN-Cache-Control": f"max-age={i}"}, ("CDN-Cache-Control",))
    assert len(fields._DIRECTIVES) <= fields._DIRECTIVES_KEPT
    assert len(targeted._directives) <= targeted._DIRECTIVES_KEPT
    assert parse_cache_control("max-age=3") == {"max-age": "3"}
