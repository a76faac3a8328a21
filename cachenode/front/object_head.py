"""The head of a stored (or storing) object's response: its fields as the
origin sent them plus the cache's own, what the request's preconditions and
Range make of it, and what a peer copying it is told besides. Written by
front/respond.py, for a hit, a peer's manifest and a growing fill.
"""

from __future__ import annotations

from aiohttp import web

from cachenode.fill.origin import add_via
from cachenode.http.conditionals import Decision, evaluate
from cachenode.http.conditionals import Outcome as RangeOutcome
from cachenode.http.digests import repr_digest_for
from cachenode.http.headers import Pairs
from cachenode.store.blocks import summary
from cachenode.store.objects import Meta
from nezha.wire import AUTHORIZE_HEADER, BLOCKS_HEADER, CACHE_HEADER, EXPIRES_HEADER


def object_headers(resp: web.StreamResponse, headers: Pairs, label: str, *, via: str | None,
                   age: int | None = None, want: str | None = None, status: int = 200) -> None:
    """A stored (or storing) response's fields, as the origin sent them, plus
    the cache's own: Age on a reuse (RFC 9111 §5.1), Via (RFC 9110 §7.6.3),
    X-Nezha-Cache. Date is the stored one (RFC 9110 §6.6.1): when the origin
    made the response, on every reuse. `want`: the client's Want-Repr-Digest,
    answered from a digest the origin published (RFC 9530 §4; http/digests.py)."""
    for name, value in headers:
        resp.headers.add(name, value)
    if (digest := repr_digest_for(want, headers, status=status)) is not None:
        resp.headers["Repr-Digest"] = digest
    if "Accept-Ranges" not in resp.headers:
        resp.headers["Accept-Ranges"] = "bytes"
    if age is not None:
        resp.headers["Age"] = str(age)
    if via is not None:
        add_via(resp.headers, via)
    resp.headers[CACHE_HEADER] = label


def stored_decision(request: web.Request, meta: Meta) -> Decision:
    """What `request`'s preconditions and Range make of the stored `meta`."""
    if meta.status == 200:
        return evaluate(request.headers, size=meta.body_size, etag=meta.etag, last_modified=meta.last_modified)
    # Preconditions and Range apply to a 200 only (RFC 9110 §13.2.1, §14.2):
    # a stored 404 or 301 is sent whole, with its own status.
    return Decision(RangeOutcome.FULL, 0, meta.body_size)


def add_peer_fields(resp: web.StreamResponse, meta: Meta, decision: Decision) -> None:
    """What a peer copying `meta` is told besides: when it expires, whether
    each read is the origin's to allow, and the block checksums its copy of
    the whole object must give (checked by the receiver)."""
    resp.headers[EXPIRES_HEADER] = f"{meta.expires_at:.3f}"
    if meta.authorize:
        resp.headers[AUTHORIZE_HEADER] = "1"
    if meta.blocks and decision.outcome is RangeOutcome.FULL:
        resp.headers[BLOCKS_HEADER] = summary(meta.blocks)
