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
sent, so its place is what left this node (front/copies_first.py UNSENT).
"""

from __future__ import annotations

import contextlib
import socket
import weakref
from typing import Any

from cachenode.fill.pace import Pace

PIECE = 256 * 1024
UNSENT = 128 * 1024


class Paced:
    """One sender of an object's bytes from here: a peer, whose place this
    node's clients pace to, or a client, paced. Offsets are in the chunk;
    `base` is the chunk's first byte in the object."""

    def __init__(self, pace: Pace, *, base: int, peer: bool, at: int) -> None:
        self._pace = pace  # held: the object's pace lives while one of its senders does
        self._base = base
        self._me = pace.join(base + at) if peer else None

    async def upto(self, at: int, available: int) -> int:
        """How far (in the chunk) this sender may send from `at`, of the bytes up to `available`."""
        if self._me is not None:
            return min(available, at + PIECE)
        while (allowed := self._pace.allowed()) is not None and allowed <= self._base + at:
            await self._pace.wait()
        return available if allowed is None else min(available, allowed - self._base)

    def sent(self, at: int) -> None:
        """This sender's bytes went up to `at` (in the chunk)."""
        if self._me is not None:
            self._pace.moved(self._me, self._base + at)

    def close(self) -> None:
        if self._me is not None:
            self._pace.left(self._me)
            self._me = None

    def __enter__(self) -> "Paced":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class PeersFirst:
    """The paces of the objects whose chunks peers read from here, by object key: each lives while a sender of it does."""

    def __init__(self) -> None:
        self._paces: weakref.WeakValueDictionary[str, Pace] = weakref.WeakValueDictionary()

    def sender(self, key: str, *, base: int, at: int, peer: bool) -> Paced:
        """A sender of `key`'s chunk starting at object offset `base`, from `at` in that chunk."""
        pace = self._paces.get(key)
        if pace is None:
            pace = self._paces[key] = Pace()
        return Paced(pace, base=base, peer=peer, at=at)


def unhurried(transport: Any, *, unsent: int = UNSENT) -> None:
    """Keep at most `unsent` bytes unsent in a peer's socket while it is
    sent a chunk (0: the system's default back, once it is done)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, unsent)
