"""Field values as HTTP spells them (RFC 9110 §5, §5.6; RFC 9111 §1.2.2, §5.2):
a field's lines combined, lists split, Cache-Control's directives,
delta-seconds and HTTP dates. Pure: no I/O.

Apart from `freshness.py`, which decides with them what is stored and for
how long, because the other rules of `http/` (Vary, conditionals, parts)
read the same syntax and nothing of freshness.

Header arguments are any `Mapping[str, str]`: a plain dict in any
capitalisation, or a case-insensitive multidict carrying repeated fields.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import date, datetime, timezone
from typing import Callable, Hashable, Iterable, Iterator, Mapping, TypeVar

from nezha.memo import keep

# RFC 9111 §1.2.2: a delta-seconds too large to represent counts as 2^31.
_DELTA_MAX = 2**31


class FieldLines(Mapping[str, str]):
    """A message's field lines, read once: `items()` yields every line in
    order, repeated names too, and every name is lowercased once, here.

    Why: a fill judges its answer by a dozen lookups (freshness, Age, Date,
    Vary, targeted fields, what is stored), and `field_value` over any other
    mapping lowercases every name of the message again for each of them.
    A lookup by name (`lines`, `[]`, `in`) ignores case, as a
    case-insensitive multidict's does; `[]` gives the first line.

    What the names alone tell (each lowercased, where each name's lines
    are, `of_names`) is worked out once for every message that names the
    same fields in the same order: an origin answers each object with the
    same names, so a fill's answer finds them worked out already."""

    __slots__ = ("pairs", "lowered", "_where", "_asked", "_names")

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.pairs = pairs = tuple(pairs)
        names = _names_of(tuple([name for name, _ in pairs]))
        self._names = names
        self._where = names.where  # lowercased name -> the positions of its lines
        self._asked = names.asked
        self.lowered = names.lowered  # each line's name, lowercased

    def _at(self, name: str) -> tuple[int, ...] | None:
        """The positions of field `name`'s lines (any case), or None when absent.
        Remembered by the name as asked (`_Names.asked`): the rules ask by
        the same few names, so a lookup is one dict's, not a lowercasing too."""
        at = self._asked.get(name, _ABSENT)
        if at is _ABSENT:
            at = self._where.get(name.lower())
            if len(self._asked) < _ASKED_KEPT:
                self._asked[name] = at
        return at  # type: ignore[return-value]

    def by_name(self) -> dict[str, list[str]]:
        """Every field's values, in order, by its lowercased name."""
        pairs = self.pairs
        return {lname: [pairs[i][1] for i in at] for lname, at in self._where.items()}

    def lines(self, name: str) -> list[str] | None:
        """Every value of field `name` (any case), in order; None when absent."""
        at = self._at(name)
        if at is None:
            return None
        pairs = self.pairs
        return [pairs[i][1] for i in at]

    def of_names(self, derive: Callable[..., _T], *args: Hashable) -> _T:
        """`derive(lowered, *args)`, of the lowercased names of this message's
        lines (`lowered`) and `args` alone, worked out once for all messages
        with these names. `derive` must read nothing else."""
        derived = self._names.derived
        key = (derive, *args)
        value = derived.get(key, _ABSENT)
        if value is _ABSENT:
            value = derive(self.lowered, *args)
            # Bounded in each argument's length, not in one size of the entry's.
            if not any(type(a) is str and len(a) > _ARG_KEPT_MAX for a in args):
                keep(derived, key, value, _DERIVED_KEPT)
        return value  # type: ignore[return-value]

    def items(self):  # type: ignore[override]
        return iter(self.pairs)

    def __getitem__(self, name: str) -> str:
        at = self._at(name)
        if at is None:
            raise KeyError(name)
        return self.pairs[at[0]][1]

    # `in` and `get` by the index, not by Mapping's, which go through a
    # KeyError for every absent field: most of a fill's lookups miss.
    def __contains__(self, name: object) -> bool:
        return self._at(name) is not None  # type: ignore[arg-type]

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        at = self._at(name)
        return default if at is None else self.pairs[at[0]][1]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


class _Names:
    """What the names of a message's lines alone tell, the same for every
    message naming the same fields in the same order."""

    __slots__ = ("lowered", "where", "asked", "derived")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.lowered = tuple([name.lower() for name in names])
        where: dict[str, tuple[int, ...]] = {}
        for i, lname in enumerate(self.lowered):
            where[lname] = where.get(lname, ()) + (i,)
        self.where = where
        self.asked: dict[str, tuple[int, ...] | None] = {}  # FieldLines._at
        self.derived: dict[tuple, object] = {}  # FieldLines.of_names


_T = TypeVar("_T")
_ABSENT = object()
# The names of the messages read lately, by their names as sent: an origin
# sends the same on every answer (nginx's eight, S3's dozen), so a handful
# are met again and again. Forgotten at this many, the bound on what
# messages naming ever new fields make the node keep; and so are a names'
# derived facts, of which a few readers keep one or two each.
# Names longer in all, and derived facts of a longer argument (a Connection
# value), are worked out for each message and not kept: what is kept stays
# within a few MiB whatever an origin sends.
_NAMES: dict[tuple[str, ...], _Names] = {}
_NAMES_KEPT = 512
_NAMES_LENGTH_MAX = 2048
_DERIVED_KEPT = 32
_ARG_KEPT_MAX = 256
_ASKED_KEPT = 64


def _names_of(names: tuple[str, ...]) -> _Names:
    known = _NAMES.get(names)
    if known is None:
        known = keep(_NAMES, names, _Names(names), _NAMES_KEPT, sum(map(len, names)), _NAMES_LENGTH_MAX)
    return known


def lines_of(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> FieldLines:
    """`headers` as `FieldLines`: itself when it is one (a fill's answer, its
    names lowercased once already), else its lines read once now. For readers
    that go over every line anyway, so that each has one way to read them."""
    if type(headers) is FieldLines:
        return headers
    items = getattr(headers, "items", None)
    return FieldLines(items() if items is not None else headers)


def field_value(headers: Mapping[str, str], name: str) -> str | None:
    """All lines of the field `name`, combined as one comma-separated list; None when absent.

    RFC 9110 §5.3: repeated lines of a list field mean the same as one line
    joining them with commas, so `Cache-Control: no-cache` plus
    `Cache-Control: max-age=60` must not lose either. A multidict yields
    every line from `items()`; a plain dict yields its one key, whatever its
    capitalisation (field names are case-insensitive, RFC 9110 §5.1).
    An empty field is "" and stays distinct from an absent one.
    """
    if type(headers) is FieldLines:
        at = headers._asked.get(name, _ABSENT)  # FieldLines._at, inlined: a dozen calls per fill
        if at is _ABSENT:
            at = headers._at(name)
        if at is None:
            return None
        pairs = headers.pairs
        # One line, most fields: its value as it is, not joined anew.
        return pairs[at[0]][1] if len(at) == 1 else ", ".join([pairs[i][1] for i in at])
    else:
        wanted = name.lower()
        values = [value for key, value in headers.items() if key.lower() == wanted]
    return ", ".join(values) if values else None


def split_list(value: str) -> list[str]:
    """Members of a comma-separated list; commas inside a quoted string don't split (RFC 9110 §5.6.1, §5.6.4)."""
    members, start, quoted, escaped = [], 0, False, False
    for i, ch in enumerate(value):
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            members.append(value[start:i])
            start = i + 1
    members.append(value[start:])
    return [m.strip(" \t") for m in members if m.strip(" \t")]


def _unquote(arg: str) -> str:
    if len(arg) >= 2 and arg[0] == arg[-1] == '"':
        body, out, i = arg[1:-1], [], 0
        while i < len(body):
            if body[i] == "\\" and i + 1 < len(body):
                i += 1
            out.append(body[i])
            i += 1
        return "".join(out)
    return arg


def parse_cache_control(value: str | None) -> dict[str, str | None]:
    """`max-age=60, no-cache="set-cookie, x", private` -> {directive: argument}.

    Names are lowercased; arguments are unquoted but keep their case. The
    first occurrence of a directive wins (RFC 9111 §4.2.1 lets a cache use
    the first of conflicting values). Both the token and the quoted form of
    an argument are accepted (RFC 9111 §5.2).
    """
    if not value:
        return {}  # most answers have no Cache-Control
    known = _DIRECTIVES.get(value)
    if known is None:
        known = {}
        for member in split_list(value):
            name, sep, arg = member.partition("=")
            name = name.strip(" \t").lower()
            if name and name not in known:
                known[name] = _unquote(arg.strip(" \t")) if sep else None
        keep(_DIRECTIVES, value, known, _DIRECTIVES_KEPT)
    return dict(known)  # the caller's own: the remembered one is never handed out


# The Cache-Control values read lately, as `parse_cache_control` read them:
# an origin sends one or two on all its answers ("public, max-age=86400"),
# and reading one through `split_list` costs a fill more than its copy.
# Forgotten at this many, the bound on what ever new values make the node keep.
_DIRECTIVES: dict[str, dict[str, str | None]] = {}
_DIRECTIVES_KEPT = 256


def delta_seconds(arg: str | None) -> float | None:
    """A delta-seconds argument (RFC 9111 §1.2.2), or None when it is not a non-negative integer."""
    if arg is None:
        return None
    arg = arg.strip(" \t")
    if not (arg.isascii() and arg.isdigit()):
        return None
    # A long digit string is beyond 2^31 anyway; don't make int() parse it.
    return float(_DELTA_MAX if len(arg) > 10 else min(int(arg), _DELTA_MAX))


_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
_TIME = r"(?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d)"
# RFC 9110 §5.6.7: IMF-fixdate, and the obsolete rfc850-date and asctime-date
# a recipient must still accept, by their grammar: one space between parts
# (asctime pads a one-digit day with a second), the zone spelt GMT. A
# near-miss ("UTC", two spaces, no comma) is no date: for Expires that means
# already expired (RFC 9111 §5.3), the one safe reading of a date the cache
# cannot be sure of. Case is not checked (the month still has to be one), nor
# are day names.
_HTTP_DATES = [re.compile(p, re.IGNORECASE | re.ASCII) for p in (
    rf"[a-z]{{3}}, (?P<d>\d\d) (?P<b>[a-z]{{3}}) (?P<Y>\d{{4}}) {_TIME} GMT",
    rf"[a-z]{{6,9}}, (?P<d>\d\d)-(?P<b>[a-z]{{3}})-(?P<y>\d\d) {_TIME} GMT",
    rf"[a-z]{{3}} (?P<b>[a-z]{{3}}) (?P<d>\d\d| \d) {_TIME} (?P<Y>\d{{4}})",
)]
# Each form's groups, read at once, and whether its year has all four digits (rfc850's has two).
_DATE_GROUPS = [(p, ("b", "d", "Y", "H", "M", "S") if "Y" in p.groupindex else ("b", "d", "y", "H", "M", "S"),
                 "Y" in p.groupindex) for p in _HTTP_DATES]
_EPOCH_DAY = date(1970, 1, 1).toordinal()


_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTH_NAMES = tuple(m.capitalize() for m in _MONTHS)


def imf_fixdate(timestamp: float) -> str:
    """`timestamp` as an IMF-fixdate (RFC 9110 §5.6.7), the one form an HTTP
    sender may generate. Spelt here rather than by email.utils.formatdate,
    whose module imports socket, or strftime, whose names follow the locale."""
    t = datetime.fromtimestamp(math.floor(timestamp), tz=timezone.utc)
    return (f"{_DAY_NAMES[t.weekday()]}, {t.day:02d} {_MONTH_NAMES[t.month - 1]} {t.year:04d} "
            f"{t.hour:02d}:{t.minute:02d}:{t.second:02d} GMT")


# Remembered: a fill judges its answer's Date several times (age, freshness),
# and Date and Last-Modified repeat across answers (one Date per second).
@functools.lru_cache(maxsize=1024)
def http_date(value: str | None) -> float | None:
    """An HTTP-date (RFC 9110 §5.6.7) as a timestamp; None when absent or invalid.

    HTTP dates are always GMT; the asctime form names no zone and is read as
    UTC. An rfc850 two-digit year is 19yy from 70 up and 20yy below, a fixed
    pivot rather than the RFC's 50-years-ahead rule, which would need a clock.
    Anything else, including a second date after a comma (two Expires lines
    combined), is invalid, which for Expires means already expired (RFC 9111 §5.3).
    """
    if not value:
        return None
    text = value.strip(" \t")
    for pattern, groups, four_digits in _DATE_GROUPS:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        month_name, day, year, hour, minute, second = m.group(*groups)
        month = _MONTHS.get(month_name.lower())
        if month is None:
            return None
        year = int(year) if four_digits else int(year) + (1900 if int(year) >= 70 else 2000)
        # The seconds since the epoch a UTC datetime of these fields has, as
        # datetime's bounds allow them (a leap second, 60, is allowed on the
        # wire but not by datetime: 59), without making one: every answer's
        # Last-Modified is read anew, and a datetime and its timestamp() cost
        # twice this (tests/unit/cachenode/http/test_http_dates.py).
        hour, minute = int(hour), int(minute)
        if hour > 23 or minute > 59:
            return None
        try:
            days = date(year, month, int(day)).toordinal() - _EPOCH_DAY
        except ValueError:
            return None
        return float(days * 86400 + hour * 3600 + minute * 60 + min(int(second), 59))
    return None
