"""When a node with a parent tier asks it, and when it gives up on it. Pure: no I/O.

A node started with `--parent` (a sidecar in a training pod, whose parent
is the cluster's Service) sends what it would send to an origin to its
parent instead: the parent answers from its disk or fills from the origin
once for every child. The I/O is cachenode/fill/upstream.py; these are the
rules it follows, each a row in tests/unit/cachenode/fill/test_parent.py.

- Only `http` targets go to the parent. A node that terminates TLS itself
  (it holds a CA) fetches its `https://` targets from the origin: the
  parent's plain port cannot carry the scheme from a client that is not one
  of its peers. A sidecar holds no CA; its TLS port passes connections
  through to the parent's (cachenode/tls/port.py).
- A request that came from a child (FROM_CHILD_HEADER) is never passed to
  this node's own parent: at most one hop between tiers, never a loop.
- A parent that is down was tried within the last RECHECK_AFTER seconds
  is not tried again until then: a black-holed Service would otherwise add
  its connect timeout to every miss.
- A request that already passed through this node (its own Via entry in
  Via) and is not a child's is a loop: in a training pod the origin's name
  resolves to the sidecar itself (hostAliases), so a sidecar's request
  "to the origin" can arrive back at it. It is refused (508), never
  joined to the very fill that is waiting for it.
- A 5xx from the parent sends the request to the origin, unless the parent
  says it passed that 5xx on from the origin (X-Nezha-Cache `pass`,
  `bypass` or `denied`): asking the origin again would double the load on
  an origin that is failing, and return the same answer. A 502 or 504 the
  parent made because it could not reach the origin is retried here: the
  pod may reach what the cluster cannot, and a job must not fail because
  the cluster did.
"""

from __future__ import annotations

from nezha.wire import PASSED_ON, ParentFallback

# After a parent could not be reached, requests go straight to the origin for this long.
RECHECK_AFTER = 5.0


def asks_parent(*, has_parent: bool, scheme: str, from_child: bool) -> bool:
    """Whether a request for a configured origin goes to the parent."""
    return has_parent and scheme == "http" and not from_child


def looped(via_fields: list[str], own_via: str, *, from_child: bool) -> bool:
    """Whether a request with these Via fields already went through the
    node whose entry is `own_via` ("1.1 node-id"). A child's request is not
    judged: a child and its parent may share a default identity."""
    if from_child:
        return False
    entries = (entry.strip() for field in via_fields for entry in field.split(","))
    # An entry may carry a comment after the pseudonym: "1.1 node (Nezha)".
    return any(" ".join(e.split()[:2]) == own_via for e in entries)


def answer_fallback(status: int, cache_value: str | None) -> ParentFallback | None:
    """Whether the parent's answer (`status`, its X-Nezha-Cache `cache_value`)
    is the parent failing, so the origin is asked instead; None: use it."""
    if status < 500:
        return None
    if cache_value in PASSED_ON:
        return None  # the origin's own 5xx, passed on untouched
    return ParentFallback.ERROR_STATUS


def may_retry_on_origin(*, has_body: bool, connected: bool) -> bool:
    """Whether a request the parent failed may be sent again to the origin.
    A body is streamed once (never held whole): once the connection to the
    parent was made it may have been read, so only a request without one,
    or one whose connection never opened, can be sent twice."""
    return not has_body or not connected


class ParentHealth:
    """The last time the parent could not be reached; a clock in seconds is
    passed in, so tests decide what time it is."""

    def __init__(self) -> None:
        self._failed_at: float | None = None

    def failed(self, now: float) -> None:
        self._failed_at = now

    def answered(self) -> None:
        self._failed_at = None

    def skip(self, now: float) -> bool:
        """True while a failure is more recent than RECHECK_AFTER."""
        return self._failed_at is not None and now - self._failed_at < RECHECK_AFTER
