"""The fast path's way back to a follower: a connection a follower worker
handed to the primary goes back to it once it is asking for hits again
(docs/cache-node.md, "Workers"). A part of `FastPath` (front/fastpath.py).

A follower hands the primary every connection whose request it cannot
answer, a miss above all, with its descriptor. Kept there for good, every
keep-alive connection a dataset loader holds crossed to the primary at its
first miss of the first epoch, and every later epoch's hits on it were the
primary's alone while the followers idled. So once a connection handed to
the primary has had GIVE_BACK_AFTER hits answered on its fast path, it goes
back to its follower at the next clean request boundary: nothing read of it
unanswered, nothing written still queued, the client not gone, writing not
paused. Counting hits, not requests, keeps a cold connection (a miss a
request) with the primary, where its fills are, and bounds what a connection
that mixes hits and misses costs: two hand-overs per GIVE_BACK_AFTER hits.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from cachenode.front.connections import Gate

GIVE_BACK_AFTER = 8  # hits answered here before a handed connection goes back to its follower


class GivesBack:
    """What `FastPath` does after each hit it answered whole, and how it lets a
    connection go (`_let_go`), here or when it hands one over."""

    transport: asyncio.Transport | None
    _give_back: Callable[[asyncio.Transport], bool] | None
    _gate: Gate
    _buf: bytearray
    _eof: bool
    _write_paused: bool
    _hits_here = 0

    def _disarm(self) -> None: ...

    def _gave_back(self) -> bool:
        """Whether the connection went back to the follower that handed it here
        (`_give_back`, which says False when it cannot take it: its link gone)."""
        self._hits_here += 1
        transport = self.transport
        if (self._give_back is None or self._hits_here < GIVE_BACK_AFTER or self._buf or self._eof
                or self._write_paused or transport is None or transport.get_write_buffer_size()):
            return False
        if not self._give_back(transport):
            return False
        self._let_go()
        return True

    def _let_go(self) -> asyncio.Transport:
        """The transport this fast path no longer serves (given back here, or
        handed to aiohttp or the primary by `FastPath._hand_off`): out of the
        gate, its head timer off."""
        transport, self.transport = self.transport, None
        self._gate.leave(self)
        self._disarm()
        return transport  # type: ignore[return-value]  # called only while it serves one
