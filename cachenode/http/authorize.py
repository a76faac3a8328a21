"""Reads of an `authorize` origin's objects: the origin decides, for every
read, whether this caller may have the stored version. Pure: no I/O.

The node never judges a credential itself (it cannot: it holds no secret,
and a signature covers the caller's own request). It asks the origin with
the caller's request exactly as sent, every signed field intact, plus two
fields the caller did not send and a signature does not cover unless the
caller sent them: `If-None-Match` with the stored ETag, so that an
authorised caller of the same version costs a 304, and `Range: bytes=0-0`,
so that any other answer carries at most one byte of body.
(docs/private-objects.md)
"""

from __future__ import annotations

import enum
from typing import Iterable, Mapping

from cachenode.http.headers import Pairs

# Fields the probe sets itself: a caller that sent one of them signed it
# (or may have), so its request cannot be changed into a probe and is
# passed through whole instead.
_PROBE_FIELDS = frozenset({"range", "if-none-match", "if-match", "if-modified-since", "if-unmodified-since",
                           "if-range"})


class Verdict(enum.Enum):
    ALLOWED = "allowed"  # 304: this caller may read the stored version
    CHANGED = "changed"  # 200, 206 or 416: the caller may read, but the object is no longer the stored one
    REFUSED = "refused"  # anything else (401, 403, 404, 5xx...): the caller gets the origin's answer


def not_probeable(headers: Mapping[str, str] | Iterable[str]) -> str | None:
    """Why a caller's request cannot be turned into a probe (it sets a field
    the probe must set), or None."""
    for name in headers:
        if name.lower() in _PROBE_FIELDS:
            return f"request sets {name}"
    return None


def probe_fields(forwarded: Pairs, *, etag: str | None) -> list[tuple[str, str]] | None:
    """The probe: the caller's `forwarded` fields in their order, then
    `If-None-Match: etag` and `Range: bytes=0-0`. None without an ETag: a
    Last-Modified date may be shared by two versions, so it never vouches
    that the caller's version is the stored one."""
    if not etag:
        return None
    return [*forwarded, ("If-None-Match", etag), ("Range", "bytes=0-0")]


def verdict(status: int) -> Verdict:
    """What the origin's answer to a probe says about the stored copy for this caller."""
    if status == 304:
        return Verdict.ALLOWED
    if status in (200, 206, 416):
        # 416: the version at the origin is shorter than the probe's one
        # byte (emptied): another version, not a refusal of this caller.
        return Verdict.CHANGED
    return Verdict.REFUSED
