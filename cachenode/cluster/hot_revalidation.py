"""Revalidating a hot copy against its owner: what to ask and what the answer
means. Pure: no I/O.

A hot copy (docs/cache-node.md, "Hot copies") that is no longer fresh, or a
request it may not answer as fresh (`no-cache`, `max-age=0`), is checked
with the key's owner the way the owner checks its own copy with the origin:
a conditional request carrying the copy's validators, relayed like any
read, so the owner answers from its disk or revalidates with the origin
itself first. A 304 that names the copy's version renews it with the
owner's expiry (EXPIRES_HEADER), so it never outlives the owner's freshness;
anything else means the copy is not the owner's version any more.

The client's own validators travel too: its If-None-Match tags join the
copy's, so an owner whose current version is the client's answers 304 for
the client even when the copy is outdated (`confirms` tells the two apart
by the 304's ETag). A client If-None-Match against a copy that has only a
Last-Modified cannot be combined with it (If-None-Match would make the owner
ignore the copy's If-Modified-Since, RFC 9110 §13.1.3): such a request is
not revalidated against the copy, it is relayed as before.
"""

from __future__ import annotations


def conditional_fields(*, etag: str | None, last_modified: str | None,
                       client_if_none_match: str | None) -> dict[str, str] | None:
    """The If-None-Match / If-Modified-Since to send the owner instead of the
    client's own; None when the copy cannot be revalidated for this request
    (no validator, or the client's If-None-Match beside a date-only copy)."""
    if etag:
        tags = etag if not client_if_none_match else f"{etag}, {client_if_none_match}"
        return {"If-None-Match": tags}
    if last_modified and client_if_none_match is None:
        return {"If-Modified-Since": last_modified}
    return None


def _opaque(tag: str) -> str:
    return tag[2:] if tag.startswith("W/") else tag


def confirms(*, etag: str | None, answer_etag: str | None, client_if_none_match: str | None) -> bool:
    """Whether the owner's 304 is about the copy's version (renew the copy),
    not about a version the client named in its own If-None-Match.

    With an ETag the 304's ETag decides (weak comparison, as If-None-Match
    does, RFC 9110 §8.8.3.2); a 304 without one confirms only when nothing
    but the copy's tag was asked. Without an ETag the copy was asked about
    by date alone, so a 304 can only be about it."""
    if not etag:
        return True
    if answer_etag:
        return _opaque(answer_etag.strip()) == _opaque(etag)
    return client_if_none_match is None


def owner_expiry(said: str | None, *, fallback: float) -> float:
    """The renewed copy's expiry: the owner's own (EXPIRES_HEADER, a Unix
    time), else `fallback` (the 304's own freshness, as a replica computes)."""
    if said is None:
        return fallback
    try:
        value = float(said)
    except ValueError:
        return fallback
    return value if value == value and value not in (float("inf"), float("-inf")) else fallback
