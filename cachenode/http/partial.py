"""Partial answers kept as parts of an object (RFC 9111 §3.3, §3.4). Pure: no I/O.

A caller of an `authorize` origin who signed its `Range` can bring the node
only the range it signed: the node may neither drop that Range nor ask for
the whole object without the caller's credentials. So a multi-part download
(boto3's `download_file`, awscli, s5cmd: a signed HEAD, then signed ranged
GETs of 8 MiB) is kept part by part: each 206 is written into its place in
a file of the object's full length, and once every byte is held the parts
are one stored object, read (each read authorised) like any other
(docs/private-objects.md, "Ranged parts").

RFC 9111 §3.4 allows combining partial responses only when they share a
strong validator: that is what the parts of one object are keyed by, and a
part under another ETag starts the object anew. This module says which 206
may be kept (`part_of`) and which bytes are held (`Extents`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from cachenode.http.fields import field_value
from cachenode.http.freshness import CREDENTIAL_FIELDS, response_directives
from cachenode.http.vary import variant, vary_names

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$", re.IGNORECASE)
_CREDENTIALS = frozenset(name.lower() for name in CREDENTIAL_FIELDS)


@dataclass(frozen=True)
class Part:
    """Bytes [first, end) of an object of `total` bytes whose strong ETag is
    `etag`, as the request's values of the fields its Vary names select it."""

    first: int
    end: int
    total: int
    etag: str
    vary: tuple[str, ...] = ()
    variant: str = ""

    def same_object(self, other: Part) -> bool:
        """Parts of one version, one variant: their bytes may be combined."""
        return (self.etag, self.total, self.vary, self.variant) == (other.etag, other.total, other.vary,
                                                                   other.variant)


def part_of(status: int, headers: Mapping[str, str], request_headers: Mapping[str, str], *,
            targeted: tuple[str, ...] = ()) -> Part | str:
    """The part a 206 answer to `request_headers` carries, or why it cannot
    be kept as one.

    Kept: one byte range of a known total, under a strong ETag, that no
    directive forbids storing, varying on no credential. `private` is no
    reason here: parts are kept only for `authorize` origins, whose every
    read the origin allows. `targeted`: the origin's targeted cache-control
    fields (RFC 9213), whose no-store counts in place of Cache-Control's."""
    if status != 206:
        return f"status {status}"
    ranges = field_value(headers, "Content-Range")
    match = _CONTENT_RANGE.match(ranges or "")
    if match is None:
        return f"Content-Range {ranges!r} is not one byte range of a known length"
    first, last, total = (int(g) for g in match.groups())
    if not first <= last < total:
        return f"Content-Range {ranges!r} is not within its length"
    etag = field_value(headers, "ETag")
    if not etag or etag.lstrip().startswith("W/") or "," in etag:
        # §3.4: only a strong validator says two parts are of one version.
        return f"ETag {etag!r} is not one strong validator"
    field, directives = response_directives(headers, targeted)
    if "no-store" in directives:
        return f"{field}: no-store"
    if field_value(headers, "Set-Cookie") is not None:
        return "it sets a cookie"
    names = vary_names(headers)
    if names is None:
        return f"Vary: {field_value(headers, 'Vary')!r} names no field a request could match"
    if _CREDENTIALS & {n.lower() for n in names}:
        return f"it varies on a credential ({', '.join(names)}): its variant would hold it"
    return Part(first=first, end=last + 1, total=total, etag=etag.strip(), vary=names,
                variant=variant(names, request_headers) if names else "")


class Extents:
    """The byte ranges of an object held so far, as sorted disjoint [start, end) pairs."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        """Hold [start, end) too; touching and overlapping spans merge."""
        if end <= start:
            return
        merged: list[tuple[int, int]] = []
        for s, e in self._spans:
            if e < start or s > end:
                merged.append((s, e))
            else:
                start, end = min(s, start), max(e, end)
        merged.append((start, end))
        merged.sort()
        self._spans = merged

    def covers(self, start: int, end: int) -> bool:
        """Whether every byte of [start, end) is held."""
        return end <= start or any(s <= start and end <= e for s, e in self._spans)

    @property
    def held(self) -> int:
        return sum(e - s for s, e in self._spans)

    @property
    def spans(self) -> list[tuple[int, int]]:
        return list(self._spans)
