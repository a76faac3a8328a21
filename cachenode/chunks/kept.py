"""An adopted chunk 0 kept for the reads of its object here.

A cold fill's first answer is chunk 0, stored by the node that asked
whether it owns the chunk or not (chunks/adopted.py `AdoptedChunks.adopt`);
the copy of a node that owns none of it goes once the chunk's owners
hold theirs. The request that led the fill reads the object here only
after its manifest is answered (a hand-off from the fast path to the
handler in between), and the node's other clients waiting on that fill
after it: dropped before they reached chunk 0, the chunk crossed the link
once more, back from its owner, on the busiest link of a stampede (seen
in test_chunk_stats_processes under load: the copy dropped 13 ms before
its leading request asked for chunk 0). So the copy is kept (`Kept`)
until a read here has passed chunk 0 and no other read here is on its way
to it, or KEEP_FOR after the owners hold it at most: a fill led by a
peer's request (a manifest answered, nothing read here) keeps it that
long, never longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

# How long a kept chunk 0 waits for a read here to pass it once its owners hold it: the leading request's
# hand-off and first chunk ask take milliseconds; a peer's fill (nothing read here) waits this long.
KEEP_FOR = 1.0


@dataclass
class Kept:
    """An adopted chunk 0 a node that owns none of it keeps for the reads of its object here."""

    key: str  # the chunk's
    reading: int = 0  # reads here that started before chunk 0 went and have not passed it yet
    passed: bool = False  # a read here has passed it (the leading request, most often), or none is awaited
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def read(self) -> bool:
        """Whether the reads here are through chunk 0: one passed it and none is on its way."""
        return self.passed and not self.reading


class Reading:
    """One read of an object here, from its first byte, until it passed chunk 0 (`done`)."""

    def __init__(self, kept: Kept | None) -> None:
        self._kept = kept

    def done(self) -> None:
        """Chunk 0 passed (or the read ended): a kept copy waits for this read no more. Idempotent."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.reading -= 1
            kept.passed = True
            kept.changed.set()


class KeptChunks:
    """The adopted chunks 0 kept here, by chunk key."""

    def __init__(self) -> None:
        self._kept: dict[str, Kept] = {}

    def keep(self, ckey: str, *, read_here: bool) -> Kept:
        """Keep chunk `ckey` for the reads here from now on (until `release`);
        `read_here`: the request that led its fill reads it here (a client's,
        where a peer's is answered the manifest): waited for too."""
        kept = self._kept[ckey] = Kept(ckey, passed=not read_here)
        return kept

    def reading(self, ckey: str) -> Reading:
        """A read here that will pass chunk `ckey`: a kept copy of it stays until it has (`Reading.done`)."""
        kept = self._kept.get(ckey)
        if kept is not None:
            kept.reading += 1
        return Reading(kept)

    async def read(self, kept: Kept, *, within: float = KEEP_FOR) -> bool:
        """Until the reads here are through `kept` (True), or `within` seconds went by (False)."""
        deadline = time.monotonic() + within
        while not kept.read() and (left := deadline - time.monotonic()) > 0:
            kept.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(kept.changed.wait(), timeout=left)
        return kept.read()

    def release(self, kept: Kept) -> None:
        """`kept` goes (its copy dropped, or kept for good); a later read waits for nothing."""
        if self._kept.get(kept.key) is kept:
            del self._kept[kept.key]
