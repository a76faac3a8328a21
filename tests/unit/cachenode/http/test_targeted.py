"""Targeted cache control (RFC 9213) read as a Structured Field Dictionary (RFC 8941)."""

import pytest
from multidict import CIMultiDict

from cachenode.http.targeted import InvalidField, parse_dictionary, targeted_directives

NAMES = ("Nezha-Cache-Control", "CDN-Cache-Control")


@pytest.mark.parametrize("value,expect", [
    ("max-age=3600", {"max-age": 3600}),
    ("no-store", {"no-store": True}),
    ("foobar, max-age=3600", {"foobar": True, "max-age": 3600}),
    ('private="set-cookie", max-age=0', {"private": "set-cookie", "max-age": 0}),
    ("a=tok/en:x, b=?0, c=1.5, d=:aGk=:", {"a": "tok/en:x", "b": False, "c": 1.5, "d": b"hi"}),
    ("a=(1 2);x=y, b;p", {"a": (1, 2), "b": True}),
    ("max-age=1,max-age=2", {"max-age": 2}),  # a repeated key keeps its last value
    ("  max-age=60 ,\tpublic  ", {"max-age": 60, "public": True}),
    ("*x=1", {"*x": 1}),
    ('s="a \\"q\\" \\\\"', {"s": 'a "q" \\'}),
])
def test_rfc8941_4_2_2_dictionaries_are_parsed(value, expect):
    assert parse_dictionary(value) == expect


@pytest.mark.parametrize("value", [
    "max-age=10000, &&&&&",
    "MaX-aGe=3600",  # keys are lowercase
    "max-age =100",
    "max-age= 100",
    "max-age=3600,",  # trailing comma
    "max-age=1234567890123456",  # an Integer has at most 15 digits
    "a=1.2345",  # a Decimal at most 3 fractional digits
    'a="unterminated',
    'a="\\x"',  # only \" and \\ escape
    "a=?2",
    "a=:not base64!:",
    "a=(1 2",
    "a=-",
    "1a=1",
])
def test_rfc8941_4_2_2_what_is_not_a_dictionary_is_refused(value):
    with pytest.raises(InvalidField):
        parse_dictionary(value)


def test_rfc9213_2_1_the_first_present_valid_field_is_chosen():
    headers = {"CDN-Cache-Control": "max-age=60", "Nezha-Cache-Control": "max-age=90"}
    assert targeted_directives(headers, NAMES) == ("Nezha-Cache-Control", {"max-age": "90"})
    assert targeted_directives({"cdn-cache-control": "max-age=60"}, NAMES) == ("CDN-Cache-Control", {"max-age": "60"})


def test_rfc9213_2_1_no_field_present_means_none():
    assert targeted_directives({"Cache-Control": "max-age=60"}, NAMES) is None
    assert targeted_directives({"CDN-Cache-Control": "max-age=60"}, ()) is None


def test_rfc9213_2_1_invalid_and_empty_fields_are_skipped():
    headers = {"Nezha-Cache-Control": "max-age=1, &", "CDN-Cache-Control": "max-age=60"}
    assert targeted_directives(headers, NAMES) == ("CDN-Cache-Control", {"max-age": "60"})
    assert targeted_directives({"CDN-Cache-Control": ""}, NAMES) is None
    assert targeted_directives({"CDN-Cache-Control": "no-store=?0"}, NAMES) is None  # a member turned off


def test_rfc9213_2_1_members_take_the_shape_of_cache_control_directives():
    _, directives = targeted_directives({"CDN-Cache-Control": 'no-store, private="x", s-maxage=5, max-age="5"'},
                                        NAMES)
    assert directives["no-store"] is None and directives["private"] == "x" and directives["s-maxage"] == "5"
    assert not directives["max-age"].isdigit()  # a String is no delta-seconds


def test_rfc8941_4_2_repeated_lines_are_joined_into_one_dictionary():
    headers = CIMultiDict([("CDN-Cache-Control", "public"), ("CDN-Cache-Control", "max-age=60")])
    assert targeted_directives(headers, NAMES) == ("CDN-Cache-Control", {"public": None, "max-age": "60"})
