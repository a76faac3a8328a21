"""Copies first: on a fill that another node reads (a streaming copy, a
relayed read), this node's own clients stay at most LEAD bytes ahead of the
slowest such peer.

In a stampede each node's link carries its own pods' reads and the stream
that feeds the next node's copy (cluster/streaming_copies.py), and every
pod of every node behind waits on that stream. TCP shares the link per
connection, and the copy lost it to the pods: on two nodes the first
owner's four pods had their 8 MiB in 3.1-4.8 s while the copy took 5.4 s,
and the other node's four pods, fed by it, ended at 6.3 s (docs/
benchmarks.md, "Stampede"). A pod ahead of the copy gains the wave nothing.
So a client's read of a fill waits while it is LEAD past the slowest peer
reading the same fill; the link then goes to the copy first, and the pods
here still end when the link has sent its bytes.

A peer that has not moved for STALL seconds (dead, stuck, or slower than
PIECE per STALL) is not waited for, so a slow peer costs a client here at
most STALL at a time, never its read. A peer's sends are cut to PIECE, so
its place moves often enough to pace by. The places are kept in
cachenode/fill/pace.py, where the fill itself is held to its replica's.
"""

from __future__ import annotations

from cachenode.fill.pace import LEAD, PIECE, STALL, UNSENT, Pace, Paced, pace_of, unhurried

__all__ = ["LEAD", "PIECE", "STALL", "UNSENT", "Pace", "Paced", "reader", "unhurried"]


def reader(fill: object, *, peer: bool, offset: int, replica: bool = False) -> Paced:
    """A reader of `fill` (any object a fill's readers share), paced with its
    other readers; `replica`: a peer that owns the key behind this node, whose
    place also holds the fill itself (cachenode/fill/pace.py)."""
    return Paced(pace_of(fill), peer=peer, offset=offset, replica=replica and peer)
