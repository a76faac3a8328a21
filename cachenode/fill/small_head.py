"""The head of an origin's answer as fill/small_gets.py reads it: a final
200 with one Content-Length, its fields named and decoded as aiohttp's
parser gives them, or nothing (that client then declines the answer). No
I/O: aiohttp lends only the names it gives known fields (`hdrs`) and the
`HttpVersion` an answer carries.

Why a module: the head is the single most expensive step of a small gets'
exchange (a cProfile of a node under bench/small_fills_ab.py put it first
among its functions per fill), so it is read in one pass: the status line
is checked by one regular expression, the rest is decoded once and split
into its lines, and each line is checked by another (a name, a colon and a
value of visible characters, spaces and tabs: RFC 9112 §4 and §5, no
obsolete line folding, no control character) and only split at its first
colon. A whole line seen before is neither checked nor split again
(`_LINES`, which keeps only lines that passed): an origin sends most of its
lines (Server, Content-Type, a size's Content-Length, Connection, the Date
of this second) with answer after answer; only a few (ETag, Last-Modified)
are each object's own. A field name seen before is not lowercased or looked
up again (`_NAMES`).
"""

from __future__ import annotations

import re

from aiohttp import HttpVersion, hdrs
from multidict import istr

from nezha.memo import keep

# A line of the head, longer: declined, as aiohttp's parser refuses it (its
# max_line_size and max_field_size), so no answer the engine would fail is stored here.
LINE_MAX = 8190

# The status line and its CRLF (a reason holds no CR: the head's first CRLF ends it).
_STATUS = re.compile(rb"HTTP/1\.([01]) 200(?: ([\t\x20-\x7e]*+))?\r\n")
# A field line, as the head is decoded (`read_head`: a byte past ASCII is a
# character past ASCII, and an ASCII byte itself). A field's name ends at its
# first colon (a colon is no tchar), and a value of these characters is,
# stripped of its spaces and tabs, RFC 9112's field-value between optional
# whitespace: so splitting a line at its first colon and stripping reads what
# a per-line match of name, OWS, value, OWS would. Neither CR nor LF is one of
# them, so the lines a head splits into at CRLF are its field lines exactly
# when each of them matches.
_FIELD_LINE = re.compile("[!#$%&'*+\\-.^_`|~0-9A-Za-z]++:[\t\x20-\x7e\x80-\U0010ffff]*+")
_VERSIONS = {b"0": HttpVersion(1, 0), b"1": HttpVersion(1, 1)}
# aiohttp's parser names a field it knows as `hdrs` spells it ("Etag" for "ETag"), which is what is stored.
_KNOWN = {str(name).lower(): name for name in vars(hdrs).values() if isinstance(name, istr)}

_OTHER, _LENGTH, _CODING, _CONNECTION = range(4)  # what a field is to this reader
_ROLES = {"content-length": _LENGTH, "transfer-encoding": _CODING, "connection": _CONNECTION}
_NAMES_MAX = 1024  # field names remembered; cleared when full (an origin chooses them)
_NAMES: dict[str, tuple[str, int]] = {}  # a name as sent -> as stored, and its role
# A field line as sent -> its (name as stored, value) pair, its role, and for a
# Connection line its members (`_tokens`). Bounded as _NAMES, and in the
# length of a line kept (longer ones are read every time): about 3 MiB of ASCII
# lines, 9 if an origin fills them with characters past U+FFFF (4 bytes each).
_LINES: dict[str, tuple[tuple[str, str], int, list[str]]] = {}
_LINES_MAX = 4096
_LINE_KEPT_MAX = 256
_NO_TOKENS: list[str] = []  # never changed: the members of a line that is not Connection


class Head:
    """An answer's head as far as small gets read it: its reason, version,
    fields (as stored), Content-Length, and whether its connection may be
    reused (`keep`, which the reader clears when more than the body came)."""

    __slots__ = ("reason", "version", "pairs", "length", "keep")

    def __init__(self, reason: str, version: HttpVersion, pairs: list[tuple[str, str]], length: int,
                 alive: bool) -> None:
        self.reason, self.version, self.pairs, self.length, self.keep = reason, version, pairs, length, alive


def _named(name: str) -> tuple[str, int]:
    lname = name.lower()
    return keep(_NAMES, name, (_KNOWN.get(lname) or name, _ROLES.get(lname, _OTHER)), _NAMES_MAX)


def _line(line: str) -> tuple[tuple[str, str], int, list[str]] | None:
    """A field line read: (name as stored, value), its role, a Connection
    line's members; None: not a field line (`_FIELD_LINE`), never kept."""
    if _FIELD_LINE.fullmatch(line) is None:
        return None
    name, _, value = line.partition(":")
    value = value.strip(" \t")
    stored, role = _NAMES.get(name) or _named(name)
    read = ((stored, value), role, _tokens(value) if role == _CONNECTION else _NO_TOKENS)
    return keep(_LINES, line, read, _LINES_MAX, len(line), _LINE_KEPT_MAX)


def read_head(head: bytes, small_max: int) -> Head | None:
    """The head of a final 200 this client answers (without its blank line),
    with its Content-Length and whether its connection may be reused; None:
    any other answer, or a head not read plainly (obsolete line folding, a
    control character, a field line without a name, a line over `LINE_MAX`)."""
    if len(head) > LINE_MAX and max(map(len, head.split(b"\r\n"))) > LINE_MAX:
        return None
    status = _STATUS.match(head)
    if status is None:
        return None  # also a head of a status line alone: no field, so no Content-Length
    pairs: list[tuple[str, str]] = []
    lengths: list[str] = []
    connection: list[str] = []
    # A value's bytes past ASCII (obs-text) as aiohttp's parser decodes them; the rest of the head is ASCII.
    for line in head[status.end():].decode("utf-8", "surrogateescape").split("\r\n"):
        read = _LINES.get(line) or _line(line)
        if read is None:
            return None
        pair, role, tokens = read
        if role:
            if role == _LENGTH:
                lengths.append(pair[1])
            elif role == _CODING:
                return None
            else:
                connection += tokens
        pairs.append(pair)
    if len(lengths) != 1:
        return None
    length = lengths[0]
    # Only ASCII digits: "\u0661".isdigit() holds too, and int() reads it.
    if not (length.isascii() and length.isdigit()) or len(length) > 18:
        return None
    size = int(length)
    if size > small_max:
        return None
    minor = status.group(1)
    # RFC 9112 §9.3: "close" ends it whatever the version; HTTP/1.0 persists only when asked to.
    alive = "close" not in connection and (minor == b"1" or "keep-alive" in connection)
    reason = (status.group(2) or b"").decode("ascii")
    return Head(reason, _VERSIONS[minor], pairs, size, alive)


def _tokens(value: str) -> list[str]:
    """The members of a list field's value (stripped of its spaces and tabs), lowercased as its bytes
    would be: only ASCII ones ("\u212a".lower() is "k")."""
    if value.isascii():
        if "," not in value:
            return [value.lower()]  # one member, nginx's "keep-alive"
        return [token.strip(" \t") for token in value.lower().split(",")]
    return [token.lower() if token.isascii() else token for token in (t.strip(" \t") for t in value.split(","))]
