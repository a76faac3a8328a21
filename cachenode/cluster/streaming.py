"""Which relayed reads share one stream from the owner, kept here as this
node's copy while it arrives (cluster/streaming_copies.py). Pure: no I/O.

Two questions, each a table in tests/unit/cachenode/cluster/test_streaming.py:
may a read wait for another read's answer instead of relaying on its own
(`may_share`), and does an owner's answer become this node's copy
(`streams`)?
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# A read that names any of these wants something of its own from the owner
# (a part, a conditional answer, a revalidation): it is relayed as it is.
_OWN_ANSWER = ("range", "if-range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since",
               "cache-control", "pragma")
# The owner's X-Nezha-Cache when it is filling the object now: its fill is the stream a copy follows.
FILLING = frozenset({"miss", "miss-joined"})


def may_share(method: str, headers: Mapping[str, str]) -> bool:
    """Whether a relayed read is a plain GET of the whole object, which any
    other plain GET's answer answers too."""
    if method != "GET":
        return False
    names = {name.lower() for name in headers}
    return not any(name in names for name in _OWN_ANSWER)


@dataclass(frozen=True)
class Head:
    """What the owner's answer to the leading read says, and what this node knows."""

    status: int
    cache: str  # the owner's X-Nezha-Cache
    length: int | None  # Content-Length
    chunked: bool  # a chunked object's manifest (CHUNKED_HEADER): its bytes are read from its chunks' owners
    varies: bool  # Vary: one variant per copy; not shared
    authorize: bool  # an `authorize` origin's object: each read is the origin's to allow
    waiting: int  # this node's other readers waiting on this answer
    replica: bool  # this node owns the key behind the one that answered (its copy is a replica, not hot)
    hot_reads: int  # reads that make a key hot (`--hot-reads`)
    hot_room: int | None  # bytes hot copies may hold (None: unbounded)
    fits: bool  # the store can take `length` bytes
    # Copy requests of nodes this one feeds waiting on this answer: each
    # stands for a node's readers behind it, so it counts as a read too.
    peers: int = 0


def streams(head: Head) -> str | None:
    """None when the answer becomes this node's copy, its readers served as
    it streams in; else why not (the answer is relayed as before)."""
    # As many reads at once as make a key hot (a replica keeps its copy
    # anyway: the owner's fill pushes it there once stored, so two will do).
    reads, needed = 1 + head.waiting + head.peers, 2 if head.replica else max(2, head.hot_reads)
    if reads < needed:
        return "read alone" if reads == 1 else f"{reads} reads at once, fewer than {needed}"
    if head.status != 200 or head.length is None or head.length <= 0:
        return f"answer {head.status} of length {head.length}"
    if head.cache not in FILLING:
        # Stored at the owner already: the hot copy's own rules (hot_reads) decide.
        return f"owner answered {head.cache or 'without X-Nezha-Cache'}"
    if head.chunked or head.varies or head.authorize:
        return "chunked" if head.chunked else "varies" if head.varies else "authorize"
    if not head.replica and head.hot_room is not None and head.length > head.hot_room:
        return f"{head.length} bytes exceed the hot share ({head.hot_room})"
    if not head.fits:
        return f"{head.length} bytes do not fit the store"
    return None


# How many nodes' copies one copy feeds besides its own pods: every link then
# carries its pods' reads and at most this many streams, whatever N is
# (docs/capacity.md, "Streaming copies in a tree"). One (a chain) up to
# CHAIN_NODES nodes: each link sends its pods' reads and one copy, K/N + 1
# streams against K/N + 2 for a heap of degree 2 (a stampede of K = 4·N on
# 4-8 nodes measured 15-25% sooner as a chain, docs/benchmarks.md,
# "Stampede"). Beyond, a heap of degree 2: a chain's depth, and the hop
# latency and any one slow node it adds for every node behind, grows with N,
# a heap's with log2(N); no run here had more than 16 nodes.
FANOUT = 2
CHAIN_NODES = 16


def fanout_for(nodes: int) -> int:
    """The degree of the tree of copies in a cluster of `nodes` nodes."""
    return 1 if nodes <= CHAIN_NODES else FANOUT


def feeds_from(position: int, *, owners: int, fanout: int = FANOUT) -> int | None:
    """Whose copy a node streams from, by positions in the key's order of all
    nodes (the ring walked from the key: its owners first). None: from the
    owners ahead of it, as any relayed read (an owner, or a node the first
    owner feeds itself). The nodes form a heap of degree `fanout` under the
    first owner, so each copy feeds at most `fanout` others and the depth is
    log_fanout(N) (N - 2 for a chain, `fanout` 1: the second owner feeds the
    third node, which feeds the fourth...); a parent is always ahead of its
    children, so no two nodes wait on each other."""
    if position < max(owners, 1) or fanout < 1:
        return None
    parent = (position - 1) // fanout
    return parent if parent > 0 else None
