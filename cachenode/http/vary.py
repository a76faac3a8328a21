"""Which stored variant a request selects under a response's `Vary`. Pure: no I/O.

RFC 9111 §4.1: a stored response answers a later request only when every
field its `Vary` names matches between the request that fetched it and the
new one. `variant()` reduces a request to one canonical string, so that
"matches" becomes string equality and the string can sit in a key, an index
entry or a log line. Normalising is allowed (§4.1: "normalizing both header
values in a way that is known to have identical semantics"); it is kept to
what is surely semantics-preserving, because two requests wrongly judged
equivalent would get each other's responses.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Mapping

from cachenode.http.fields import field_value

VARIANT_MAX_BYTES = 4096

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 §5.6.2
_OWS_RUN = re.compile(r"[ \t]+")
_PARAM_SEP = re.compile(r"[ \t]*;[ \t]*")


def vary_names(headers: Mapping[str, str]) -> tuple[str, ...] | None:
    """Lowercased, de-duplicated, sorted field names across all `Vary` lines of a response.

    () when the response varies on nothing; None when it can never be
    reused: a member is "*" (RFC 9110 §12.5.5), or a member is not a field
    name, which no request could carry and this cache cannot match safely.
    """
    listed = field_value(headers, "Vary")
    if listed is None:
        return ()  # most answers vary on nothing
    return _names_listed(listed)


# Remembered: an origin that varies sends the same Vary on every answer ("Accept-Encoding").
@functools.lru_cache(maxsize=256)
def _names_listed(listed: str) -> tuple[str, ...] | None:
    """`vary_names` of a response whose Vary lines combined are `listed`."""
    names = set()
    for member in listed.split(","):
        member = member.strip(" \t")
        if not member:
            continue  # RFC 9110 §5.6.1: empty list members are ignored
        if member == "*" or not _TOKEN.fullmatch(member):
            return None
        names.add(member.lower())
    return tuple(sorted(names))


def _escape(text: str) -> str:
    """Make text safe for JSON and a log line, injectively.

    Anything `str.isprintable()` rejects (C0 and C1 controls, line and
    paragraph separators, lone surrogates) becomes a backslash escape, and
    a backslash itself is doubled, so distinct values stay distinct: a
    replacement character would make two requests look equivalent.
    """
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    return "".join(out)


def _normalise(name: str, value: str) -> str:
    """One field's combined value in canonical form.

    Whitespace around commas and inside runs is not meaningful in list
    fields (RFC 9110 §5.6.1, §5.6.3), nor are empty members. Content codings
    are case-insensitive and their order carries no meaning once each keeps
    its q-value (RFC 9110 §12.5.3, §8.4.1), so Accept-Encoding is lowercased
    and sorted. Other fields keep their case: a language tag or media type
    parameter may be case-sensitive for the origin.
    """
    members = [_OWS_RUN.sub(" ", m.strip(" \t")) for m in value.split(",")]
    members = [m for m in members if m]
    if name == "accept-encoding":
        members = sorted({_PARAM_SEP.sub(";", m).lower() for m in members})
    return ", ".join(members)


def variant(names: tuple[str, ...], request_headers: Mapping[str, str]) -> str:
    """A canonical string for the variant a request selects under `names` (from `vary_names()`).

    One line per name, in the order given: `name=value` with the request's
    normalised value, or the bare `name` when the request lacks the field,
    since an absent field and an empty one may select different responses
    (RFC 9111 §4.1). Two requests are equivalent under the response's Vary
    exactly when their strings are equal. A string longer than
    VARIANT_MAX_BYTES becomes "sha256:<hex>" of it, so a request with huge
    headers cannot bloat keys or logs; no plain variant starts that way,
    because ":" cannot be part of a field name.
    """
    lines = []
    for name in names:
        name = name.lower()
        value = field_value(request_headers, name)
        lines.append(name if value is None else f"{name}={_escape(_normalise(name, value))}")
    text = "\n".join(lines)
    encoded = text.encode("utf-8")
    if len(encoded) > VARIANT_MAX_BYTES:
        return "sha256:" + hashlib.sha256(encoded).hexdigest()
    return text


def selecting_headers(names: tuple[str, ...], variant_text: str) -> dict[str, str] | None:
    """Request fields that select the variant `variant_text` again: what a
    node sends a peer to copy that one variant. None when the variant cannot
    be spelled as fields (hashed, or a value that needed escaping)."""
    if not names:
        return {}
    if variant_text.startswith("sha256:") or "\\" in variant_text:
        return None
    fields: dict[str, str] = {}
    lines = variant_text.split("\n")
    if len(lines) != len(names):
        return None
    for name, line in zip(names, lines):
        got, sep, value = line.partition("=")
        if got != name:
            return None
        if sep:
            fields[name] = value
    return fields if variant(names, fields) == variant_text else None
