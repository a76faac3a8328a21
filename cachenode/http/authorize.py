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

A caller's own `Range` stays as signed (boto3's download_file signs each
part's): the probe then asks for that range, and an answer other than 304
is the caller's own answer. A caller's `If-Match` stays too: the origin
evaluates it before If-None-Match (RFC 9110 §13.2.2), so a 304 still means
"this version, and your precondition holds", and a 412 is the caller's.
"""

from __future__ import annotations

import enum
from typing import Iterable, Mapping

from cachenode.http.headers import Pairs

# Fields whose meaning the probe's If-None-Match would change: a caller
# that sent one of them signed it (or may have), so its request cannot be
# made into a probe and is passed through whole instead. (If-Modified-Since
# is ignored beside If-None-Match, If-Range is evaluated after it, and
# If-Unmodified-Since after If-Match: the node would answer them wrongly.)
_PROBE_FIELDS = frozenset({"if-none-match", "if-modified-since", "if-unmodified-since", "if-range"})


class Verdict(enum.Enum):
    ALLOWED = "allowed"  # 304: this caller may read the stored version
    CHANGED = "changed"  # 200, 206 or 416: the caller may read, but the object is no longer the stored one
    REFUSED = "refused"  # anything else (401, 403, 404, 5xx...): the caller gets the origin's answer


# Authorization schemes whose signature covers If-None-Match and Range
# whether or not the caller sent them: Azure Storage's Shared Key puts both
# in the string it signs, so any probe of such a request fails to verify.
_SIGNS_PROBE_FIELDS = ("sharedkey ",)


def not_probeable(headers: Mapping[str, str] | Iterable[str]) -> str | None:
    """Why a caller's request cannot be turned into a probe (it sets a field
    the probe must set, or signs the probe's fields even unset), or None.
    `headers`: the request's fields, or only their names."""
    for name in headers:
        if name.lower() in _PROBE_FIELDS:
            return f"request sets {name}"
    if isinstance(headers, Mapping):
        scheme = (headers.get("Authorization") or "").lstrip().lower()
        if scheme.startswith(_SIGNS_PROBE_FIELDS):
            return "its Authorization scheme signs If-None-Match and Range (Azure Shared Key)"
    return None


def probe_fields(forwarded: Pairs, *, etag: str | None) -> list[tuple[str, str]] | None:
    """The probe: the caller's `forwarded` fields in their order, then
    `If-None-Match: etag`, and `Range: bytes=0-0` unless the caller sent a
    Range of its own. None without an ETag: a Last-Modified date may be
    shared by two versions, so it never vouches that the caller's version
    is the stored one."""
    if not etag:
        return None
    if asks_own_range(forwarded):
        return [*forwarded, ("If-None-Match", etag)]
    return [*forwarded, ("If-None-Match", etag), ("Range", "bytes=0-0")]


def asks_own_range(fields: Pairs) -> bool:
    """The caller sent a Range: a probe's answer other than 304 is then the caller's own answer."""
    return any(name.lower() == "range" for name, _ in fields)


def verdict(status: int) -> Verdict:
    """What the origin's answer to a probe says about the stored copy for this caller."""
    if status == 304:
        return Verdict.ALLOWED
    if status in (200, 206, 416):
        # 416: the version at the origin is shorter than the probe's one
        # byte (emptied): another version, not a refusal of this caller.
        return Verdict.CHANGED
    return Verdict.REFUSED
