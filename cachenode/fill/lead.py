"""What a flight's leader does with the answer it got, and how a fill reads it. Pure: no I/O.

The leader of a flight (`fill/engine.py`, `lead`) asks the origin (or, for a copy,
a peer's disk) once for everybody waiting on a key. What it then does
depends only on facts about that answer and about what is stored; this
module names those facts and returns the step, so every branch is a row in
a unit test and `lead` keeps only the I/O of the step chosen.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from cachenode.http.freshness import CREDENTIAL_FIELDS, STORED_STATUSES, Policy
from cachenode.http.headers import MAX_STORED_HEADER_BYTES


class Step(enum.Enum):
    PEER_REFUSED = "peer-refused"  # a peer had no stored copy: a replica never falls back to the origin
    REVALIDATED = "revalidated"  # 304 for the stored object: it is fresh again
    STALE_ON_ERROR = "stale-on-error"  # 5xx, and the stored object may be served stale (RFC 5861)
    PASS = "pass"  # the answer goes to its client(s) and is not stored (`reason` says why)
    FILL = "fill"  # store it while streaming it to every client of the flight


@dataclass(frozen=True)
class Answer:
    """What the origin or peer answered, and what this node knows about storing it."""

    status: int
    policy: Policy  # freshness.response_policy of the answer
    vary: tuple[str, ...] | None  # the fields it varies on; None: a Vary no request could match
    vary_listed: str = ""  # its Vary as sent, for the reason
    has_validator: bool = False  # ETag or Last-Modified
    fits: bool = True  # its Content-Length fits the store's capacity (True when unknown)
    length: int | None = None
    header_bytes: int = 0  # of the fields that would be stored with it
    from_peer: bool = False  # a copy asked of a peer's disk
    peer_says_hit: bool = False  # that peer answered from its disk (X-Nezha-Cache: hit)
    # Its origin has `credentials: authorize`: each read of a stored copy is
    # authorised with the stored ETag (http/authorize.py), which it must have,
    # and a variant must not be chosen by a credential.
    authorized_reads: bool = False
    has_etag: bool = False


@dataclass(frozen=True)
class Decision:
    step: Step
    reason: str | None = None


def decide(answer: Answer, *, stale_held: bool, stale_usable_on_error: bool) -> Decision:
    """The step for `answer`; `stale_held`: a stored object was being revalidated,
    `stale_usable_on_error`: it may still be served when the origin fails."""
    a = answer
    # A stored 404 or 301 is a copy too, when the peer says it came from its disk.
    if a.from_peer and a.status != 200 and (a.status not in STORED_STATUSES or not a.peer_says_hit):
        return Decision(Step.PEER_REFUSED)
    if a.status == 304 and stale_held:
        return Decision(Step.REVALIDATED)
    if a.status >= 500 and stale_held and stale_usable_on_error:
        return Decision(Step.STALE_ON_ERROR)
    reason = _not_stored_because(a)
    return Decision(Step.PASS, reason) if reason is not None else _FILL


_FILL = Decision(Step.FILL)  # most answers' decision, one for all (a Decision never changes)


_CREDENTIALS = frozenset(name.lower() for name in CREDENTIAL_FIELDS)


def _not_stored_because(a: Answer) -> str | None:
    if not a.policy.storable:
        return a.policy.reason
    if a.vary is None:
        return f"Vary: {a.vary_listed[:100]!r} names no field a request could match"
    if a.length is not None and not a.fits:
        return f"{a.length} bytes exceed capacity"
    if a.policy.ttl <= 0 and not a.has_validator:
        return "it is stale at once and has no validator: it could never be reused"
    if a.authorized_reads and not a.has_etag:
        return "it has no ETag: no read of a stored copy could be authorised by the origin"
    if a.authorized_reads and a.vary and _CREDENTIALS & {v.lower() for v in a.vary}:
        return f"it varies on a credential ({a.vary_listed[:100]}): its variant would hold it"
    if a.header_bytes > MAX_STORED_HEADER_BYTES:
        return (f"its header fields take {a.header_bytes} bytes, more than the "
                f"{MAX_STORED_HEADER_BYTES} this cache stores with an object")
    return None


class How(enum.Enum):
    """How a fill reads the body it stores."""

    PARALLEL = "parallel"  # several range requests at once (fill/parallel.py), falling back to one stream
    SPLICED = "spliced"  # socket -> pipe -> temp file, no byte through Python; a stream if the socket cannot be taken
    STREAM = "stream"  # aiohttp's reader, one read at a time


@dataclass(frozen=True)
class Body:
    """What a fill knows about the body it is about to read."""

    from_peer: bool  # a copy from a peer's disk (never fetched in ranges: one stream is all or nothing)
    delimited_by_close: bool  # no length and no chunking: only the close ends it (no ranges of it)
    rangeable: bool  # fill/parallel.py found a validator and a length worth parallel ranges
    client_ranged: bool  # the leading client asked for a Range of it
    # Asked with the leading caller's own credentials (an `authorize`
    # origin): the origin gets that request as sent, never range requests
    # the caller did not sign, made in its name, maybe after it expired.
    callers_own: bool = False
    # The parent tier's answer (`--parent`): one stream too, since the parent
    # fetches the origin's in ranges itself, and its ranges would be asked of
    # a tier whose answer to each may come from elsewhere (a fallback). Read
    # through aiohttp's reader, never spliced: if the parent breaks off
    # mid-body, the rest is asked of the origin and joined on in Python.
    from_parent: bool = False
    # The answer is the origin's 206 to a resume (`Resume`): the rest of the
    # object is fetched around it in ranges, whatever its size.
    resumed: bool = False
    # Of known length, at most the store's small objects' size
    # (cachenode/store/small.py): read through aiohttp's reader and written
    # on the event loop, never spliced, since a splice runs on a thread and
    # the hand-off there and back costs more than a few pages take to copy.
    small: bool = False
    # A copy that goes on from another source when its own breaks off mid-body
    # (a streaming copy, cachenode/cluster/streaming_copies.py): spliced like
    # any peer's copy, its rest joined on in Python from the byte the file
    # reached (`Fill.run_spliced`'s `rest`). Through aiohttp's reader, every
    # node of a stampede's tree spent the loop on each byte it passed on, and
    # a copy's sender saw a slow reader: its link's share went to its pods.
    goes_on: bool = False


@dataclass(frozen=True)
class Resume:
    """A request for the rest of a body under If-Range (a relay resuming after
    its source broke off, or any client doing the same): a fill it leads asks
    the origin for this range first, and fetches the rest of the object
    around the answer (cachenode/fill/slices.py), instead of the whole object
    from byte 0 while it waits."""

    first: int
    last: int | None  # None: to the end
    if_range: str

    @property
    def range(self) -> str:
        return f"bytes={self.first}-{'' if self.last is None else self.last}"


_ONE_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d+)-(\d*)\s*$", re.IGNORECASE)
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$", re.IGNORECASE)


def resume_of(range_field: str | None, if_range: str | None) -> Resume | None:
    """The resume a request's Range and If-Range ask for, or None: one range
    that starts past byte 0, pinned by a validator that is not weak (RFC 9110
    §13.1.5; a weak one makes the origin answer the whole object anyway)."""
    if not range_field or not if_range or if_range.startswith("W/"):
        return None
    m = _ONE_RANGE.match(range_field)
    if m is None or int(m.group(1)) == 0:
        return None
    first, last = int(m.group(1)), int(m.group(2)) if m.group(2) else None
    if last is not None and last < first:
        return None
    return Resume(first=first, last=last, if_range=if_range)


def answered_span(resume: Resume, status: int, content_range: str | None) -> tuple[int, int, int] | None:
    """(first, end exclusive, object length) of a 206 that answers `resume`
    exactly, or None: any other answer starts the fill the usual way."""
    if status != 206 or content_range is None:
        return None
    m = _CONTENT_RANGE.match(content_range)
    if m is None:
        return None
    first, last, total = (int(g) for g in m.groups())
    wanted_last = total - 1 if resume.last is None else min(resume.last, total - 1)
    if first != resume.first or last != wanted_last or last >= total:
        return None
    return first, last + 1, total


@dataclass(frozen=True)
class Plan:
    how: How
    on_demand: bool = False  # PARALLEL: only the slices clients ask for are fetched (fill_on_range off)


def plan_fill(body: Body, *, splice_fills: bool, fill_on_range: bool) -> Plan:
    """How to read `body`: in parallel ranges when it may be, else spliced
    when `splice_fills` is on, else streamed. A client's Range makes a
    parallel fill fetch on demand unless `fill_on_range` says fill it all."""
    if body.resumed:
        return Plan(How.PARALLEL, on_demand=not fill_on_range)
    if (not body.from_peer and not body.from_parent and not body.delimited_by_close and body.rangeable
            and not body.callers_own):
        return Plan(How.PARALLEL, on_demand=body.client_ranged and not fill_on_range)
    return Plan(How.SPLICED if splice_fills and not body.from_parent and not body.small
                else How.STREAM)


@dataclass(frozen=True)
class Arrived:
    """What a leader knows of an answer's body the moment its head is read."""

    status: int
    method: str  # of the request it answers
    length: int | None  # its Content-Length
    buffered: int  # bytes of the body the client has read with the head
    complete: bool  # the body's end has been read too
    from_peer: bool = False
    from_parent: bool = False


def stored_at_once(body: Arrived, *, small_max: int, how: How) -> bool:
    """Whether an answer the leader stores (`decide`: FILL) is stored at once,
    before any client is answered (`AtOnce.store_whole`), rather than
    streamed to its clients while it is written (`FillRuns.start`).

    At once: a 200 to a GET from the origin itself, of a known length up to
    the store's small objects' size (cachenode/store/small.py), whose whole
    body came with its head (a small answer from a near origin comes in one
    segment), and that the plan reads as one stream. Nothing is then left to
    stream: the fill's buffer, background task and followers would cost a
    small fill more than it costs to store (docs/benchmarks.md, "Small
    objects"). A slow origin's small body, a peer's or the parent tier's
    copy, a body fetched in ranges: streamed as they come, as before.
    """
    return (body.status == 200 and body.method == "GET" and not body.from_peer and not body.from_parent
            and body.length is not None and 0 < body.length <= small_max
            and body.complete and body.buffered == body.length and how is not How.PARALLEL)
