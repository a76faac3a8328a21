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

import contextlib
import socket
from typing import Any

from cachenode.fill.pace import LEAD, STALL, Pace, pace_of

__all__ = ["LEAD", "PIECE", "STALL", "Pace", "Paced", "reader"]

PIECE = 256 * 1024
# Bytes a peer's socket may hold not yet sent (TCP_NOTSENT_LOWAT): a send
# returns once they are on their way, so a peer's place is what its link
# carried, give or take what flies, not what its send buffer took (which
# TCP's autotuning grew to megabytes: the clients paced to it ran that far
# ahead of the copy actually sent, and the copy was the slowest stream of its link).
UNSENT = 128 * 1024


class Paced:
    """One reader of a fill: a peer, whose place the clients pace to, or a client, paced."""

    def __init__(self, pace: Pace, *, peer: bool, offset: int, replica: bool = False) -> None:
        self._pace = pace
        self._peer = pace.join(offset, replica=replica) if peer else None

    async def upto(self, offset: int, available: int) -> int:
        """Where this reader may send to from `offset`, of the bytes up to `available`."""
        if self._peer is not None:
            return min(available, offset + PIECE)
        while (allowed := self._pace.allowed()) is not None and allowed <= offset:
            await self._pace.wait()
        return available if allowed is None else min(available, allowed)

    def sent(self, offset: int) -> None:
        if self._peer is not None:
            self._pace.moved(self._peer, offset)

    def close(self) -> None:
        if self._peer is not None:
            self._pace.left(self._peer)
            self._peer = None


def reader(fill: object, *, peer: bool, offset: int, replica: bool = False) -> Paced:
    """A reader of `fill` (any object a fill's readers share), paced with its
    other readers; `replica`: a peer that owns the key behind this node, whose
    place also holds the fill itself (cachenode/fill/pace.py)."""
    return Paced(pace_of(fill), peer=peer, offset=offset, replica=replica and peer)


def unhurried(transport: Any, *, unsent: int = UNSENT) -> None:
    """Keep at most `unsent` bytes unsent in a peer's socket (`transport`'s),
    so that its place says what left this node, while it reads a fill; 0
    gives the system's default back (no limit) once it is done: a stored
    object relayed later on the same connection goes out in large sends."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, unsent)
