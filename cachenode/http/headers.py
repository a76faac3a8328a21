"""Which header fields cross the cache, and which it keeps. Pure: no I/O.

The cache stands where the origin stood for every client of an aliased host
(hostAliases send all of a pod's traffic for that host here), so it passes
every end-to-end field both ways, in the order and repetition the sender
used (RFC 9110 §5.3: a repeated field is one list, and its order matters).
Only hop-by-hop fields stop here (RFC 9110 §7.6.1): they describe one
connection, and the cache's connections are its own.

Headers travel as lists of (name, value) pairs: a dict would lose repeated
fields (`Link`, `x-amz-meta-*` pairs, `Vary`) and their order.
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping, MutableMapping

from cachenode.http.fields import FieldLines, field_value, imf_fixdate, lines_of
from cachenode.http.freshness import Policy, response_policy
from nezha.wire import OWN_PREFIX  # the cache's own fields: never taken from a sender (a peer's copy carries them)

Pairs = tuple[tuple[str, str], ...]

# RFC 9110 §7.6.1, plus Proxy-* (Proxy-Authorization, Proxy-Authenticate and
# the non-standard Proxy-Connection all speak to the next hop, not the origin).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"})
_HOP_PREFIXES = ("proxy-",)
_STORED_PREFIXES = (*_HOP_PREFIXES, OWN_PREFIX)
# Framing the cache writes itself for each message it sends.
FRAMING = frozenset({"content-length", "host"})
# Never stored with an object (RFC 9111 §3.1, §5.1): Age describes one
# message at one moment and is the cache's own estimate on every reuse;
# Set-Cookie belongs to one client (a response carrying it is never shared at
# all). Date is stored: it says when the origin generated the response, and
# a reuse keeps it (RFC 9110 §6.6.1, RFC 9111 §4), with Age saying how long
# the response has been kept since. Every other end-to-end field is stored as
# it came, the obsolete Set-Cookie2 included (RFC 9111 §3.1).
NOT_STORED = frozenset({"age", "set-cookie"})
# Stored header bytes per object: beyond this a response is passed, not stored
# (its metadata is read on every start-up and hit).
MAX_STORED_HEADER_BYTES = 64 * 1024


_NONE_LISTED: frozenset[str] = frozenset()


def connection_listed(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> frozenset[str]:
    """The field names a message's `Connection` fields name: hop-by-hop too (§7.6.1)."""
    return _listed_in(field_value(lines_of(headers), "Connection"))


def _listed_in(connection: str | None) -> frozenset[str]:
    """The names a message's `Connection` lines (`connection`, combined) list, lowercased."""
    return _NONE_LISTED if connection is None else _listed(connection)


# Remembered: an origin sends the same Connection on every answer ("keep-alive", "close").
@functools.lru_cache(maxsize=64)
def _listed(value: str) -> frozenset[str]:
    """The names a `Connection` value lists, lowercased."""
    return frozenset(t.strip().lower() for t in value.split(",") if t.strip())


def end_to_end_pairs(headers: Mapping[str, str] | Iterable[tuple[str, str]], *,
                     drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Every end-to-end field of a message, in order, repeats kept; without the
    hop-by-hop fields, the framing (Content-Length, Host) and the lowercased
    names in `drop`."""
    return _end_to_end(headers, drop, _HOP_PREFIXES)


def _end_to_end(headers: Mapping[str, str] | Iterable[tuple[str, str]], drop: frozenset[str],
                prefixes: tuple[str, ...]) -> list[tuple[str, str]]:
    """`end_to_end_pairs` without, too, the names that start with one of
    `prefixes` (which name Proxy-*). Which lines those are depends on the
    message's names and its Connection alone: worked out once for all
    messages alike (`FieldLines.of_names`), an origin's answers all are."""
    lines = lines_of(headers)
    pairs = lines.pairs
    return [pairs[i] for i in lines.of_names(_kept_at, field_value(lines, "Connection"),
                                             drop if type(drop) is frozenset else frozenset(drop), prefixes)]


def _kept_at(lowered: tuple[str, ...], connection: str | None, drop: frozenset[str],
             prefixes: tuple[str, ...]) -> tuple[int, ...]:
    """The positions of the lines `_end_to_end` keeps of a message whose
    names are `lowered` and whose Connection lines combined are `connection`:
    not hop-by-hop (HOP_BY_HOP, the names its Connection lists and those
    starting with one of `prefixes`), framing, nor in `drop`."""
    left_out = HOP_BY_HOP | FRAMING | _listed_in(connection) | drop
    return tuple([i for i, lname in enumerate(lowered) if not (lname in left_out or lname.startswith(prefixes))])


def stored_pairs(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> Pairs:
    """What is kept with a stored object: the end-to-end fields minus Age,
    Set-Cookie and the cache's own X-Nezha-* fields (a peer's copy carries them)."""
    return tuple(_end_to_end(headers, NOT_STORED, _STORED_PREFIXES))


def with_date(pairs: Pairs, received_at: float) -> Pairs:
    """`pairs` with a Date: their own, else one for `received_at`.

    RFC 9110 §6.6.1: a recipient with a clock that stores or forwards a
    response without Date adds one for when it was received, so every reuse
    of it says the same moment and Age counts from there."""
    if first(pairs, "Date") is not None:
        return pairs
    return (*pairs, ("Date", imf_fixdate(received_at)))


def header_bytes(pairs: Iterable[tuple[str, str]]) -> int:
    """Size of the fields as they go on the wire (`Name: value\\r\\n`)."""
    size = 0
    for name, value in pairs:  # a loop, not sum() over a generator: a third less time per fill
        size += len(name) + len(value) + 4
    return size


def first(pairs: Iterable[tuple[str, str]], name: str) -> str | None:
    """The first value of field `name` (case-insensitive), or None."""
    lname = name.lower()
    for n, v in pairs:
        if n.lower() == lname:
            return v
    return None


def joined(pairs: Iterable[tuple[str, str]], name: str) -> str | None:
    """Every value of field `name` as one comma-separated list (RFC 9110 §5.3), or None."""
    lname = name.lower()
    values = [v for n, v in pairs if n.lower() == lname]
    return ", ".join(values) if values else None


def _last_coding(value: str) -> str:
    codings = [c.strip(" \t").lower() for c in value.split(",") if c.strip(" \t")]
    return codings[-1] if codings else ""


def delimited_by_close(status: int, headers: Mapping[str, str] | Iterable[tuple[str, str]], *,
                       method: str = "GET") -> bool:
    """Whether a response's body ends only where its connection closes (RFC 9112 §6.3).

    Such a body cannot be proven whole: an origin that dies after 5,000 bytes
    looks exactly like one that sent 5,000, so it may be streamed but never
    stored. A body is framed when its Transfer-Encoding ends in `chunked`
    (a missing last-chunk of that coding is an error) or when it has a Content-Length (a
    short body is an error); a response to HEAD, a 1xx, 204 or 304 has none.
    Doubtful framing counts as close-delimited: several Transfer-Encoding
    lines are chunked only if the first line alone also ends in `chunked`,
    since some parsers read only the first.
    """
    if method.upper() == "HEAD" or 100 <= status < 200 or status in (204, 304):
        return False
    lines = lines_of(headers)
    codings = lines.lines("Transfer-Encoding")
    if codings:
        return not (_last_coding(", ".join(codings)) == "chunked" and _last_coding(codings[0]) == "chunked")
    return lines.lines("Content-Length") is None


# Fields of a 304 that do not replace the stored ones (RFC 9111 §3.2): they
# describe the 304 message itself, or the cache recomputes them.
# Content-Encoding stays: it says how the stored bytes are encoded.
_NOT_UPDATED = frozenset({"content-length", "content-range", "content-encoding"})


def updated_by_304(stored: Pairs, update: Iterable[tuple[str, str]]) -> Pairs:
    """The stored fields after a 304: every field the 304 carries replaces all
    stored fields of that name (RFC 9111 §3.2), the others stay as they were,
    in their order; new fields go last."""
    fresh = [(n, v) for n, v in stored_pairs(update) if n.lower() not in _NOT_UPDATED]
    replaced = {n.lower() for n, _ in fresh}
    kept = [(n, v) for n, v in stored if n.lower() not in replaced]
    return tuple(kept + fresh)


def renewed_by_304(status: int, stored: Pairs, answer: Iterable[tuple[str, str]], *, now: float,
                   policy_ttl: float | None, private_ok: bool = False,
                   targeted: tuple[str, ...] = ()) -> tuple[Pairs, Policy]:
    """A stored response renewed by a 304 (`answer`, as received at `now`):
    its fields as the 304 updates them (RFC 9111 §3.2), and what the renewed
    response may be. A 304 without Date is dated now (RFC 9110 §6.6.1); its
    Age and Date, not stored, date the lifetime it grants, and the object's
    age restarts from them."""
    answer = tuple(answer)
    merged = updated_by_304(stored, with_date(answer, now))
    dating = {n.lower() for n, _ in answer} & {"age", "date"}
    judged = FieldLines(tuple((n, v) for n, v in merged if n.lower() not in dating)
                    + tuple((n, v) for n, v in answer if n.lower() in dating))
    return merged, response_policy(status, judged, now=now, policy_ttl=policy_ttl, private_ok=private_ok,
                                   targeted=targeted)


# Fields that describe a whole body: true of a 200, false of any range of
# it. S3's checksums (boto3 checks them against what it receives),
# Content-MD5 (RFC 1864) and Content-Digest (RFC 9530), which digest the
# message's content; Repr-Digest and Digest digest the representation,
# which a range does not change, and stay.
_WHOLE_BODY_PREFIXES = ("x-amz-checksum-",)
_WHOLE_BODY_FIELDS = frozenset({"content-md5", "content-digest"})


def describes_whole_body(name: str) -> bool:
    """Whether field `name` describes the whole object, so a 206 leaves it off."""
    lname = name.lower()
    return lname in _WHOLE_BODY_FIELDS or lname.startswith(_WHOLE_BODY_PREFIXES)


def drop_whole_body_fields(headers: MutableMapping[str, str]) -> None:
    """Remove from a 206's fields those that describe the whole object, as S3
    leaves them off its own ranged answers."""
    doomed = {n.lower() for n in headers if describes_whole_body(n)}
    for name in doomed:
        del headers[name]  # a multidict drops every value of the name, in any case
