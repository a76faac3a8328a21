"""The node-to-node and node-to-operator protocol: one copy of every name on the wire. Pure.

Cache nodes talk to each other over plain HTTP inside the cluster; the
controller, `nezha up` and the CLI talk to nodes too. Every header, path and
outcome they exchange is named here, so a node that writes one and a part
that reads it cannot drift apart (a renamed header would otherwise break a
relay silently, not loudly).

Outcomes are `StrEnum`s: a member is its wire value (`CacheOutcome.HIT == "hit"`),
so it goes into a header or a log line as it is, and a value read back from
the wire compares equal to the member.
"""

from __future__ import annotations

from enum import StrEnum

# -- headers ------------------------------------------------------------------
# What happened to a request (`CacheOutcome` below), on every response a node makes
# from the cache or the origin.
CACHE_HEADER = "X-Nezha-Cache"
# The node that served a relayed response.
SERVED_BY_HEADER = "X-Nezha-Served-By"
# Why the origin failed (refused, reset, timed out), on a 502/504 it caused.
ORIGIN_ERROR_HEADER = "X-Nezha-Origin-Error"
# On a response to a peer: the owner's expiry, so copies age alike.
EXPIRES_HEADER = "X-Nezha-Expires"
# On a whole object sent to a peer: the summary of the node's own block
# checksum (cachenode/store/blocks.py), which the receiver checks before it commits.
BLOCKS_HEADER = "X-Nezha-Blocks"
# The whole-object digest (cachenode/http/digests.py `carry`) a node knows
# its bytes by, handed to a peer: on an owner's answer from a fill in
# progress, the digest that fill checks (the relay checks it too: Hugging
# Face's X-Linked-ETag came on a redirect the relay may never have seen);
# on a relay's request, the digest of the head it began with (a resume:
# the next owner's fill, led by the resume's 206, checks the whole object
# against it) or the one a Hugging Face redirect it passed on named for
# this target (the owner's fill checks it). Believed only from a peer, and
# never passed to a client or an origin.
DIGEST_HEADER = "X-Nezha-Digest"
# On a response to a peer: "1" when the object is an `authorize` origin's, so
# the copy is served only once the origin allows each read there too.
AUTHORIZE_HEADER = "X-Nezha-Authorize"
# A request relayed by another node: never relayed again, so nothing loops.
PEER_HEADER = "X-Nezha-Peer"
# The cluster token that proves a request comes from a peer.
TOKEN_HEADER = "X-Nezha-Token"
# The scheme a relayed request came in with: peers talk plain HTTP inside the
# cluster, so a client's https:// request would otherwise become an http:// key
# on its owner. Believed only from a peer.
SCHEME_HEADER = "X-Nezha-Scheme"
# A request a child node (a sidecar, `nezha cache --parent`) sent to its
# parent: the parent answers it from its disk or fills from the origin, and
# never passes it to a parent of its own, so tiers never loop. Like every
# X-Nezha-* field it is stripped before anything reaches an origin. Not
# authenticated: a client that forges it can only make a node skip its
# parent and ask the origin itself (docs/cache-node.md, "A parent tier").
FROM_CHILD_HEADER = "X-Nezha-From-Child"
# A peer's request for one chunk of a chunked object (nezha/chunks.py), as
# JSON: index, chunk size, the object's length and validators. The chunk's
# owner answers the Range asked of that chunk from its disk, or fills the
# chunk from the origin under those validators first. Believed only from a peer.
CHUNK_HEADER = "X-Nezha-Chunk"
# On a node's answer to a chunk request, or to CUT_HEADER's question: its own
# fill failed (its source, the origin or an owner ahead of it, broke off), and
# why. The node is alive: the asker goes on from its next source and does not
# count the node down, as it does a peer that does not answer.
FILL_FAILED_HEADER = "X-Nezha-Fill-Failed"
# A peer's question after the node's answer for an object (with CHUNK_HEADER:
# for that chunk) broke off mid-body: why? The node answers 200 with
# FILL_FAILED_HEADER when it cut the answer because its own fill failed, 404
# when it knows of no such cut (cachenode/peers/cuts.py). Believed only from a peer.
CUT_HEADER = "X-Nezha-Cut"
# On a chunk owner's 421 to a peer passing the chunk on: read it from this
# node instead ("<id> <host:port>"), which reads it now (cachenode/chunks/feeders.py).
CHUNK_FEEDER_HEADER = "X-Nezha-Chunk-Feeder"
# On a response to a peer: the object is chunked, answered by the node that
# holds its manifest; such an answer is never copied whole (a hot copy, a replica).
CHUNKED_HEADER = "X-Nezha-Chunked"
# A request of the controller's prefetch (controller/prefetch.py): "fill" asks
# a node to fill an object, "check" whether it is stored yet. The node runs
# few fills at a time while it serves live requests (cachenode/front/pacing.py).
# Not authenticated: a client that sends it only makes its own request wait.
PREFETCH_HEADER = "X-Nezha-Prefetch"
PREFETCH_FILL = "fill"
PREFETCH_CHECK = "check"
# On a node's 503 to a fill that waited its longest behind live traffic: ask again.
PREFETCH_WAIT = "wait"
# Every field of the cache's own, lowercased: never stored with an object,
# never passed to an origin.
OWN_PREFIX = "x-nezha-"

# -- paths --------------------------------------------------------------------
# Internal endpoints, for peers and the tools of the cluster only (cluster token).
INTERNAL_PREFIX = "/_nezha/"
REPLICATE_PATH = "/_nezha/replicate"  # POST: copy one object from a peer
REPLICAS_PATH = "/_nezha/replicas"  # POST: small objects a peer pushes, in records (cachenode/cluster/replica_frames.py)
HANDOFF_PATH = "/_nezha/handoff"  # POST: hand every object to its owners; GET: progress
INVALIDATE_PATH = "/_nezha/invalidate"  # POST: forget keys a write superseded
PINS_PATH = "/_nezha/pins"  # POST: pin a workload's keys, or release them; GET: pinned bytes per workload
STORED_PATH = "/_nezha/stored"  # POST: which of the prefetch fills the controller started here are stored
PREFETCH_PATH = "/_nezha/prefetch"  # POST: fill these public objects here; a line per URL as each is stored
# Probes and metrics, on any Host that is not an origin.
ADMIN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class ParentFallback(StrEnum):
    """Why a request meant for a node's parent tier (`--parent`) went to the
    origin: the `reason` label of `nezha_parent_fallbacks_total` and of the
    `parent_fallback` log line (cachenode/fill/parent.py, cachenode/tls/port.py)."""

    UNREACHABLE = "unreachable"  # connection refused or reset, no route, TLS or protocol error
    TIMEOUT = "timeout"  # no connection or no answer within the timeouts
    ERROR_STATUS = "5xx"  # the parent answered 5xx of its own
    DOWN = "down"  # it failed within RECHECK_AFTER: not tried
    BROKEN = "broken"  # its answer broke off mid-body: the rest came from the origin


class CacheOutcome(StrEnum):
    """`X-Nezha-Cache`: what a node did with a request (README, "value | meaning")."""

    HIT = "hit"
    # Served from this node's hot copy of an object it does not own, copied
    # from an owner (docs/cache-node.md, "Hot copies").
    HOT_HIT = "hot-hit"
    # Served from this node's copy as it streams in from the owner's fill: in
    # a stampede the node's readers share one stream from the owner
    # (docs/cache-node.md, "Streaming copies").
    HOT_MISS = "hot-miss"
    MISS = "miss"
    MISS_JOINED = "miss-joined"
    REVALIDATED = "revalidated"
    STALE = "stale"
    PASS = "pass"
    BYPASS = "bypass"
    # An origin with `credentials: authorize` (docs/private-objects.md):
    # it said this caller may read the stored version, which was served...
    AUTHORIZED = "authorized"
    # ...or it refused this caller, whose answer from the origin was passed on.
    DENIED = "denied"
    # Only in the request log: answers the node made itself.
    REFUSED = "refused"
    ERROR = "error"


# A relayed answer's value is the owner's, behind this prefix (`peer-hit`).
PEER_PREFIX = "peer-"
# Answers copied from the origin for one client: a relay passes them on untouched.
PASSED_ON = frozenset({CacheOutcome.PASS, CacheOutcome.BYPASS, CacheOutcome.DENIED})


def origin_error_value(error: object) -> str:
    """`error` as one short header-safe line for ORIGIN_ERROR_HEADER."""
    return " ".join(str(error).split())[:200] or "origin failed"


def relayed(value: str) -> str:
    """The value a relaying node reports for its owner's `value`."""
    return PEER_PREFIX + value


class DrainOutcome(StrEnum):
    """How a node's hand-off on leaving the ring ended (`nezha:drain:<node>` outcome)."""

    HANDED_OFF = "handed off"
    INCOMPLETE = "incomplete"
    TIMED_OUT = "timed out"
    # Nothing was handed off, and nothing needed to be.
    STANDALONE = "standalone"
    RESTART = "restart"
    EMPTY = "empty"


class ReplicateResult(StrEnum):
    """How one replica copy ended: the `result` of the last line a node's
    REPLICATE_PATH answer streams (one JSON object a line), which the asking
    node (a fill's replication, a hand-off) counts by."""

    COPIED = "copied"
    # The node already held the object fresh, or revalidated its copy.
    PRESENT = "present"


# A copy that did not happen: this prefix, then why (`failed: 503 ...`).
FAILED_PREFIX = "failed: "


def replicate_failed(why: object) -> str:
    """The result of a copy that failed for `why`."""
    return FAILED_PREFIX + str(why)
