"""Targeted cache control (RFC 9213): cache directives addressed to one class
of caches, read from a Structured Field Dictionary (RFC 8941). Pure: no I/O.

An origin says `CDN-Cache-Control: max-age=86400` to the shared caches run
in front of it and `Cache-Control: max-age=60` to everyone else; Nezha is
such a cache. Each origin names the fields that target Nezha, in order
(`targeted_cache_control`, default `Nezha-Cache-Control` then
`CDN-Cache-Control`): the first one present with a valid, non-empty value
decides, and `Cache-Control` and `Expires` are then ignored for this cache's
own storing and freshness (RFC 9213 §2.1). The fields themselves travel on
untouched, to clients and to any cache after this one.

A targeted field that is not a valid Dictionary is ignored as if absent
(§2.1): a typo must not turn `no-store` into anything. Its members become
the same `{directive: argument}` shape `freshness.parse_cache_control`
gives, so one set of rules applies to both: an Integer is its digits, a
Token or String its text, a bare member None. A delta-seconds directive
whose value is not an Integer (`max-age="60"`) keeps an argument that is no
number, which the freshness rules read as malformed: already stale.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Mapping

# Directives whose argument is delta-seconds (RFC 9111 §1.2.2, RFC 5861):
# in a targeted field they must be Integers (RFC 9213 §2.1).
_DELTA_DIRECTIVES = frozenset({"max-age", "s-maxage", "stale-if-error", "stale-while-revalidate"})

_KEY = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_INTEGER = re.compile(r"-?[0-9]{1,15}")
_DECIMAL = re.compile(r"-?[0-9]{1,12}\.[0-9]{1,3}")
_TOKEN = re.compile(r"[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*")


class InvalidField(ValueError):
    """A value that is not a Structured Field Dictionary (RFC 8941 §4.2.2)."""


class _Boolean(int):
    """A parsed `?1`/`?0`, kept apart from an Integer 1 or 0."""


class _Token(str):
    """A parsed Token, kept apart from a String."""


class _Parser:
    """RFC 8941 §4.2 parsing, the parts a Dictionary needs."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def _peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def _ows(self) -> None:
        while self._peek() in (" ", "\t"):
            self.i += 1

    def _sp(self) -> None:
        while self._peek() == " ":
            self.i += 1

    def _match(self, pattern: re.Pattern[str]) -> str | None:
        m = pattern.match(self.s, self.i)
        if m is None:
            return None
        self.i = m.end()
        return m.group()

    def dictionary(self) -> dict[str, object]:
        self._sp()
        out: dict[str, object] = {}
        while self.i < len(self.s):
            key = self._key()
            if self._peek() == "=":
                self.i += 1
                out[key] = self._member()
            else:
                out[key] = _Boolean(1)
                self._parameters()
            self._ows()
            if self.i >= len(self.s):
                break
            if self._peek() != ",":
                raise InvalidField(f"expected ',' at {self.i}, found {self._peek()!r}")
            self.i += 1
            self._ows()
            if self.i >= len(self.s):
                raise InvalidField("a trailing comma")
        self._sp()
        if self.i != len(self.s):
            raise InvalidField(f"unparsed text at {self.i}")
        return out

    def _key(self) -> str:
        key = self._match(_KEY)
        if key is None:
            raise InvalidField(f"expected a key at {self.i}, found {self._peek()!r}")
        return key

    def _member(self) -> object:
        if self._peek() == "(":
            self.i += 1
            items = []
            while True:
                self._sp()
                if self._peek() == ")":
                    self.i += 1
                    break
                items.append(self._bare_item())
                self._parameters()
                if self._peek() not in (" ", ")"):
                    raise InvalidField(f"an inner list item ends badly at {self.i}")
            self._parameters()
            return tuple(items)
        value = self._bare_item()
        self._parameters()
        return value

    def _parameters(self) -> None:
        # Parameters are parsed for validity, then dropped: no cache directive has any.
        while self._peek() == ";":
            self.i += 1
            self._sp()
            self._key()
            if self._peek() == "=":
                self.i += 1
                self._bare_item()

    def _bare_item(self) -> object:
        ch = self._peek()
        if ch == "-" or ch.isdigit():
            decimal = self._match(_DECIMAL)
            if decimal is not None:
                return float(decimal)
            integer = self._match(_INTEGER)
            if integer is None or (self._peek().isdigit() or self._peek() == "."):
                raise InvalidField(f"a number out of range at {self.i}")
            return int(integer)
        if ch == '"':
            return self._string()
        if ch == ":":
            end = self.s.find(":", self.i + 1)
            if end < 0:
                raise InvalidField("an unterminated byte sequence")
            try:
                value = base64.b64decode(self.s[self.i + 1:end], validate=True)
            except binascii.Error as e:
                raise InvalidField(f"a byte sequence that is not base64: {e}") from e
            self.i = end + 1
            return value
        if ch == "?":
            if self.s[self.i + 1:self.i + 2] not in ("0", "1"):
                raise InvalidField(f"a boolean that is neither ?0 nor ?1 at {self.i}")
            self.i += 2
            return _Boolean(int(self.s[self.i - 1]))
        token = self._match(_TOKEN)
        if token is None:
            raise InvalidField(f"no item at {self.i}: {ch!r}")
        return _Token(token)

    def _string(self) -> str:
        self.i += 1
        out = []
        while self.i < len(self.s):
            ch = self.s[self.i]
            self.i += 1
            if ch == "\\":
                nxt = self._peek()
                if nxt not in ('"', "\\"):
                    raise InvalidField("a string escapes something other than '\"' or '\\'")
                out.append(nxt)
                self.i += 1
            elif ch == '"':
                return "".join(out)
            elif not (" " <= ch <= "~"):
                raise InvalidField("a string holds a character outside printable ASCII")
            else:
                out.append(ch)
        raise InvalidField("an unterminated string")


def parse_dictionary(value: str) -> dict[str, object]:
    """A Structured Field Dictionary (RFC 8941 §4.2.2): member name -> value
    (int, float, str, bytes, bool or a tuple for an inner list); a repeated
    name keeps its last value. Raises InvalidField."""
    return _Parser(value).dictionary()


def _argument(name: str, value: object) -> str | None:
    if isinstance(value, _Boolean):
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
        wanted = name.lower()
        lines = [v for k, v in headers.items() if k.lower() == wanted]
        if not lines:
            continue
        try:
            members = parse_dictionary(", ".join(lines))
        except InvalidField:
            continue
        directives = {k: _argument(k, v) for k, v in members.items()
                      if not (isinstance(v, _Boolean) and v == 0)}
        if directives:
            return name, directives
    return None
