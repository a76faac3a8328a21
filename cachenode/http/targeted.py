"""Targeted cache control (RFC 9213): cache directives addressed to one class
of caches, read from a Structured Field Dictionary. Pure: no I/O.

An origin says `CDN-Cache-Control: max-age=86400` to the shared caches run
in front of it and `Cache-Control: max-age=60` to everyone else; Nezha is
such a cache. Each origin names the fields that target Nezha, in order
(`targeted_cache_control`, default `Nezha-Cache-Control` then
`CDN-Cache-Control`): the first one present with a valid, non-empty value
decides, and `Cache-Control` and `Expires` are then ignored for this cache's
own storing and freshness (RFC 9213 §2.1). The fields themselves travel on
untouched, to clients and to any cache after this one.

The parsing is `http-sf`'s (RFC 9651, which obsoletes RFC 8941); this module
only decides what a cache makes of the result. RFC 9213 defines its fields
as RFC 8941 Dictionaries, so the two item types RFC 9651 added (Dates and
Display Strings) are refused here as an RFC 8941 parser refuses them.

A targeted field that is not a valid Dictionary is ignored as if absent
(§2.1): a typo must not turn `no-store` into anything. Its members become
the same `{directive: argument}` shape `fields.parse_cache_control`
gives, so one set of rules applies to both: an Integer is its digits, a
Token or String its text, a bare member None. A delta-seconds directive
whose value is not an Integer (`max-age="60"`) keeps an argument that is no
number, which the freshness rules read as malformed: already stale.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Mapping

import http_sf

from cachenode.http.fields import field_value
from nezha.memo import keep

# Directives whose argument is delta-seconds (RFC 9111 §1.2.2, RFC 5861):
# in a targeted field they must be Integers (RFC 9213 §2.1).
_DELTA_DIRECTIVES = frozenset({"max-age", "s-maxage", "stale-if-error", "stale-while-revalidate"})


class InvalidField(ValueError):
    """A value that is not a Structured Field Dictionary (RFC 8941 §4.2.2)."""


def _bare(value: object) -> object:
    """One bare item as plain Python: a Token its text, a Decimal a float."""
    if isinstance(value, (datetime, http_sf.DisplayString)):
        raise InvalidField(f"{value!r} is an RFC 9651 type that an RFC 8941 Dictionary has not")
    if isinstance(value, http_sf.Token):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    return value


def parse_dictionary(value: str) -> dict[str, object]:
    """A Structured Field Dictionary (RFC 8941 §4.2.2): member name -> value
    (int, float, str, bytes, bool or a tuple for an inner list); a repeated
    name keeps its last value, and parameters are dropped (no cache directive
    has any). Raises InvalidField."""
    try:
        members = http_sf.parse(value.encode("ascii"), tltype="dictionary")
    except UnicodeEncodeError as e:
        raise InvalidField(f"a character outside ASCII at {e.start}") from e
    except http_sf.StructuredFieldError as e:
        raise InvalidField(str(e)) from e
    out: dict[str, object] = {}
    for name, (member, _parameters) in members.items():
        out[name] = tuple(_bare(item) for item, _ in member) if isinstance(member, list) else _bare(member)
    return out


def _argument(name: str, value: object) -> str | None:
    if isinstance(value, bool):
        # A bare member; `?0` is a directive turned off, which a cache can
        # only read as absent, so callers drop it before this.
        return None
    if name in _DELTA_DIRECTIVES:
        # Only an Integer is delta-seconds here; anything else keeps a text
        # no delta-seconds parser accepts ("-1" stays "-1": malformed too).
        return str(value) if isinstance(value, int) else f"not an integer: {value!r}"
    return str(value)


def targeted_directives(headers: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, dict[str, str | None]] | None:
    """The first field of `names` present in `headers` with a valid, non-empty
    Dictionary value, as (its name, its directives); None when there is none
    and Cache-Control rules (RFC 9213 §2.1). Repeated lines of a field are
    one Dictionary (RFC 8941 §4.2)."""
    for name in names:
        value = field_value(headers, name)
        if value is None:
            continue
        directives = _directives.get(value, _UNREAD)
        if directives is _UNREAD:
            directives = keep(_directives, value, _directives_of(value), _DIRECTIVES_KEPT)
        if directives:
            return name, dict(directives)  # the caller's own: the remembered one is never handed out
    return None


def _directives_of(value: str) -> dict[str, str | None] | None:
    """A targeted field's value as directives; None when it is no Dictionary."""
    try:
        members = parse_dictionary(value)
    except InvalidField:
        return None
    return {k: _argument(k, v) for k, v in members.items() if v is not False}


# The targeted values read lately, as `_directives_of` read them: an origin
# sends the same on all its answers, and http-sf's parsing of one costs a
# fill more than its copy. Forgotten at this many, the bound on what ever
# new values make the node keep.
_directives: dict[str, dict[str, str | None] | None] = {}
_DIRECTIVES_KEPT = 256
_UNREAD = object()
