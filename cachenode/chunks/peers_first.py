"""Peers first: while other nodes read a chunked object's chunks from this
node, this node's own clients of that object stay within LEAD of the
slowest of them, by offsets in the object.

A stampede on a chunked object sends every chunk from its owner to every
other node's readers, and every node's clients read in order: a node whose
pass of chunk k crawls has clients that wait, and a link that sits idle.
The owner's link carries those passes beside its own clients' reads, and
TCP shares a FIFO link by what each connection has in flight: at N = 8 the
owner of chunk 0 sent its four clients most of its link for 4 s while the
passes of chunk 0 to four other nodes got about 0.25 MB/s each, and those
nodes' 16 clients could not start before 4.1 s (docs/benchmarks.md, "Chunk
stampedes: where the time goes"). A client here ahead of those peers gains
the wave nothing: its bytes are sent anyway, and the link's time is the same.
So this node's clients of an object wait while they are LEAD past the
slowest peer reading any of its chunks from here, as a whole object's
clients keep behind the copy of it (front/copies_first.py), across chunks:
offsets in the object, not in one fill.

A peer that has not moved for STALL seconds (fill/pace.py) is not waited
for, so a slow or dead peer costs a client here at most STALL at a time,
never its read. A peer's bytes are sent PIECE at a time so its place moves
often enough to pace by, and its socket keeps at most UNSENT bytes not yet
sent, so its place is what left this node. Both, and the sender (`Paced`),
are a whole object's copies first's too (fill/pace.py): here a chunk's
sender counts from the chunk's first byte in the object.
"""

from __future__ import annotations

import weakref

from cachenode.fill.pace import PIECE, UNSENT, Pace, Paced, unhurried

__all__ = ["PIECE", "UNSENT", "Paced", "PeersFirst", "unhurried"]


class PeersFirst:
    """The paces of the objects whose chunks peers read from here, by object key: each lives while a sender of it does."""

    def __init__(self) -> None:
        self._paces: weakref.WeakValueDictionary[str, Pace] = weakref.WeakValueDictionary()

    def sender(self, key: str, *, base: int, at: int, peer: bool) -> Paced:
        """A sender of `key`'s chunk starting at object offset `base`, from `at` in that chunk."""
        pace = self._paces.get(key)
        if pace is None:
            pace = self._paces[key] = Pace()
        return Paced(pace, base=base, peer=peer, offset=at)
