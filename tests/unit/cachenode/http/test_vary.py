import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from cachenode.http.vary import VARIANT_MAX_BYTES, variant, vary_names


def multi(*pairs):
    return CIMultiDict(pairs)


@pytest.mark.parametrize("headers,names", [
    ({}, ()),
    ({"Vary": ""}, ()),
    ({"Vary": "Accept-Encoding"}, ("accept-encoding",)),
    ({"vary": "Accept-Encoding, accept, ACCEPT-ENCODING"}, ("accept", "accept-encoding")),
    ({"Vary": " , Origin ,,"}, ("origin",)),
    (multi(("Vary", "Origin"), ("VARY", "Accept")), ("accept", "origin")),
    ({"Vary": "*"}, None),
    ({"Vary": "Accept, *"}, None),
    (multi(("Vary", "Accept"), ("Vary", "*")), None),
    ({"Vary": "Accept Encoding"}, None),  # not a field name: cannot be matched, never reused
    ({"Vary": "Accept=x"}, None),
])
def test_vary_names_are_the_sorted_lowercased_members_or_none_for_star(headers, names):
    assert vary_names(headers) == names


@pytest.mark.parametrize("names,headers,expect", [
    ((), {"Accept": "x"}, ""),
    (("accept",), {}, "accept"),
    (("accept",), {"Accept": ""}, "accept="),
    (("accept",), {"accept": "text/html"}, "accept=text/html"),
    (("accept",), {"Accept": "  text/html ,application/json;  q=0.5  "}, "accept=text/html, application/json; q=0.5"),
    (("accept",), {"Accept": "Text/HTML, a"}, "accept=Text/HTML, a"),  # case kept outside Accept-Encoding
    (("accept",), {"Accept": "a\t\t b"}, "accept=a b"),
    (("accept",), multi(("Accept", "a"), ("accept", "b")), "accept=a, b"),
    (("accept",), {"Accept": "a,,b"}, "accept=a, b"),
    (("accept-encoding",), {"Accept-Encoding": "GZIP, br;Q=1.0, Identity ; q=0"},
     "accept-encoding=br;q=1.0, gzip, identity;q=0"),
    (("accept-encoding",), {"Accept-Encoding": "br, gzip, br"}, "accept-encoding=br, gzip"),
    (("accept", "origin"), {"Origin": "https://a.example"}, "accept\norigin=https://a.example"),
    (("Origin",), {"origin": "o"}, "origin=o"),
])
def test_variant_is_one_normalised_line_per_vary_name(names, headers, expect):
    assert variant(names, headers) == expect


@pytest.mark.parametrize("a,b", [
    ({}, {"Accept": ""}),  # absent is not empty
    ({"Accept": "a, b"}, {"Accept": "b, a"}),  # order matters outside Accept-Encoding
    ({"Accept": "text/html"}, {"Accept": "TEXT/HTML"}),
    ({"Accept": "a\x01"}, {"Accept": "a\x02"}),  # control characters stay distinct
    ({"Accept": "a\\x01"}, {"Accept": "a\x01"}),  # and cannot be forged by their escape
    ({"Accept": "a"}, {"Accept": "a\naccept-encoding=gzip"}),
])
def test_requests_that_may_select_different_responses_get_different_variants(a, b):
    names = ("accept", "accept-encoding")
    assert variant(names, a) != variant(names, b)


@pytest.mark.parametrize("value", ["a\x00b", "a\nb", "a\rb", "a\x1bb", "a\x7fb", "a\x85b", "a\u2028b", "a\udcffb"])
def test_control_characters_never_reach_the_variant(value):
    got = variant(("accept",), {"Accept": value})
    assert got.isprintable() and got.startswith("accept=a\\") and got.endswith("b")
    json.dumps(got, ensure_ascii=False).encode("utf-8")  # no lone surrogate survives


@pytest.mark.parametrize("size,hashed", [(VARIANT_MAX_BYTES - len("accept="), False),
                                         (VARIANT_MAX_BYTES - len("accept=") + 1, True),
                                         (100_000, True)])
def test_a_long_variant_becomes_a_fixed_length_digest(size, hashed):
    got = variant(("accept",), {"Accept": "x" * size})
    if hashed:
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", got)
    else:
        assert got == "accept=" + "x" * size


def test_long_variants_that_differ_get_different_digests():
    assert variant(("accept",), {"Accept": "x" * 5000}) != variant(("accept",), {"Accept": "x" * 5000 + "y"})


def test_the_byte_bound_counts_utf8_bytes_not_characters():
    assert variant(("accept",), {"Accept": "\u00e9" * 3000}).startswith("sha256:")


_member = st.text(st.characters(codec="ascii", categories=("L", "N", "P", "S"), exclude_characters=","),
                  min_size=1, max_size=8)
_ows = st.text(st.sampled_from(" \t"), max_size=3)


@given(name=st.sampled_from(["accept", "accept-encoding", "origin"]), members=st.lists(_member, min_size=1, max_size=5),
       data=st.data())
def test_variant_ignores_whitespace_around_commas_and_header_name_case(name, members, data):
    spaced = ",".join(data.draw(_ows) + m + data.draw(_ows) for m in members)
    cased = "".join(c.upper() if data.draw(st.booleans()) else c for c in name)
    names = ("accept", "accept-encoding", "origin")
    assert variant(names, {cased: spaced}) == variant(names, {name: ", ".join(members)})


@pytest.mark.parametrize("request_headers", [
    {"Accept-Encoding": "GZIP, br;q=0.5"},
    {"Accept-Encoding": ""},
    {},
    {"Accept-Encoding": "gzip", "Accept-Language": "fr-CH,  fr;q=0.9"},
])
def test_selecting_headers_select_the_same_variant_again(request_headers):
    from cachenode.http.vary import selecting_headers

    names = ("accept-encoding", "accept-language")
    text = variant(names, request_headers)
    fields = selecting_headers(names, text)
    assert fields is not None and variant(names, fields) == text


def test_a_variant_that_cannot_be_spelled_as_fields_has_no_selecting_headers():
    from cachenode.http.vary import selecting_headers

    assert selecting_headers(("x-long",), variant(("x-long",), {"X-Long": "v" * 10_000})) is None
    assert selecting_headers(("x-ctl",), variant(("x-ctl",), {"X-Ctl": "a\x01b"})) is None
    assert selecting_headers((), "") == {}
