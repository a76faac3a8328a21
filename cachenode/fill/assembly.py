"""Objects assembled from the parts callers signed for (http/partial.py).

A signed ranged read of an `authorize` origin goes to the origin as the
caller sent it; its 206, while streamed to that caller, is written into its
place in a temp file as long as the object (sparse until filled). When
every byte is held the temp file is committed as the whole object, stored
like a fill's, `authorize` like a fill's: from then on each read of it,
ranged or not, is authorised at the origin and served from disk
(front/authorized.py). Until then nothing is served from the parts.

Parts are kept in memory's account only: a restart forgets an object half
assembled (its temp file is deleted at start-up like any fill's). The store
reserves an assembly's full length, so a half-assembled object cannot push
the disk past its capacity, and an assembly nobody added to for
`PART_IDLE` seconds gives its room back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import structlog

from cachenode.counts import Counts
from cachenode.http.freshness import current_age, response_policy
from cachenode.http.headers import stored_pairs, with_date
from cachenode.http.partial import Extents, Part, part_of
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.store.writing import ObjectWrite
from nezha.config import Origin
from nezha.credentials import redact_url
from nezha.errors import NezhaError
from nezha.keys import Target

log = structlog.get_logger("nezha.cachenode")

PART_IDLE = 600.0  # seconds a half-assembled object keeps its room with no part added
MAX_ASSEMBLIES = 64  # objects assembled at once; beyond it the idlest gives way, or the part is not kept
# A part's fields that describe the part, not the object (the whole-body
# digests S3 leaves off ranged answers are dropped the same way).
_PART_FIELDS = frozenset({"content-range", "content-md5", "content-digest"})


@dataclass
class _Assembly:
    key: str
    url: str
    host: str
    target: Target
    part: Part  # the first part kept: its ETag and total stand for every later one
    meta: Meta  # the object as it will be stored
    write: ObjectWrite  # the store's write of the whole object, sparse until every part is in
    held: Extents = field(default_factory=Extents)
    writers: int = 0
    touched: float = 0.0
    ended: bool = False  # stored, or dropped: no part is written into it any more
    released: bool = False  # its temp file discarded (once its last writer is done)


class PartWriter:
    """One caller's part, written as it streams to that caller. A write the
    disk refuses ends the keeping of this part, never the caller's stream."""

    def __init__(self, assemblies: Assemblies, assembly: _Assembly, part: Part) -> None:
        self._assemblies = assemblies
        self._assembly = assembly
        self._at = part.first
        self._end = part.end
        self._broken = False
        self._closed = False

    async def write(self, chunk: bytes) -> None:
        a = self._assembly
        if self._broken or a.ended:
            return
        if self._at + len(chunk) > self._end:
            self._broken = True
            log.warning("part_not_kept", key=a.key, reason="more bytes than its Content-Range")
            return
        try:
            await self._assemblies.store.write_at(a.write.temp, self._at, chunk)
        except NezhaError as e:
            self._broken = True
            log.warning("part_not_kept", key=a.key, reason=str(e))
            return
        a.held.add(self._at, self._at + len(chunk))
        self._at += len(chunk)

    async def close(self) -> Meta | None:
        """This part is done (whole or cut short); the object it completed, if it did."""
        if self._closed:
            return None
        self._closed = True
        self._assembly.writers -= 1
        return await self._assemblies.settle(self._assembly)


class Assemblies:
    def __init__(self, *, store: Store, counts: Counts, replicate: Callable[[Meta, Target], None],
                 clock: Callable[[], float] = time.time, idle: float = PART_IDLE,
                 limit: int = MAX_ASSEMBLIES) -> None:
        self.store = store
        self.counts = counts
        self.replicate = replicate
        self._clock = clock
        self._idle = idle
        self._limit = limit
        self._by_key: dict[str, _Assembly] = {}
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._by_key)

    async def keep(self, status: int, headers: Mapping[str, str], request_headers: Mapping[str, str], *,
                   key: str, url: str, target: Target, origin: Origin) -> PartWriter | None:
        """A writer for the part this answer to `request_headers` carries, or None when it is not kept."""
        part = part_of(status, headers, request_headers, targeted=origin.targeted_cache_control)
        if isinstance(part, str):
            log.info("part_not_kept", key=key, reason=part)
            return None
        # One at a time: the parts of a download arrive together, and two
        # answers must not each begin an assembly of the same object.
        async with self._lock:
            stored = self.store.lookup(key, request_headers)
            if stored is not None and stored.etag == part.etag:
                return None  # whole already: its reads are served from disk
            now = self._clock()
            a = self._by_key.get(key)
            if a is not None and not a.part.same_object(part):
                if a.writers:
                    return None  # another version still streaming to its callers: it settles first
                await self._end(a, why=f"the origin answered ETag {part.etag}")
                a = None
            if a is None:
                a = await self._begin(part, headers, key=key, url=url, target=target, origin=origin, now=now)
                if a is None:
                    return None
            a.writers += 1
            a.touched = now
            return PartWriter(self, a, part)

    async def _begin(self, part: Part, headers: Mapping[str, str], *, key: str, url: str, target: Target,
                     origin: Origin, now: float) -> _Assembly | None:
        await self._tidy(now)
        if len(self._by_key) >= self._limit:
            log.info("part_not_kept", key=key, reason=f"{self._limit} objects are being assembled")
            return None
        if not self.store.fits(part.total):
            log.info("part_not_kept", key=key, reason=f"{part.total} bytes exceed capacity")
            return None
        try:
            # Nothing reads an assembly before its commit: parts are served only whole.
            write = await self.store.writing(reserve=part.total, readable=False, must_write=True).open()
        except NezhaError as e:
            log.warning("part_not_kept", key=key, reason=str(e))
            return None
        kept = tuple((n, v) for n, v in stored_pairs(headers)
                     if n.lower() not in _PART_FIELDS and not n.lower().startswith("x-amz-checksum-"))
        kept = with_date(kept, now)
        policy = response_policy(200, headers, now=now, policy_ttl=origin.default_ttl, private_ok=True,
                                 targeted=origin.targeted_cache_control)
        meta = Meta(key=key, url=redact_url(url, origin.credential_params), host=target.host, size=part.total, headers=kept, stored_at=now,
                    expires_at=now + policy.ttl, stale_if_error=0.0, age=current_age(headers, now),
                    stale_while_revalidate=policy.stale_while_revalidate, vary=part.vary, variant=part.variant,
                    authorize=True)
        a = _Assembly(key=key, url=url, host=target.host, target=target, part=part, meta=meta, write=write,
                      touched=now)
        self._by_key[key] = a
        log.info("assembly_started", key=key, etag=part.etag, bytes=part.total)
        return a

    async def settle(self, a: _Assembly) -> Meta | None:
        """Store the object once every byte is in and no part is still writing."""
        if a.ended:
            if not a.writers and not a.released:  # dropped while a part was still streaming
                a.released = True
                await a.write.discard()
            return None
        if a.writers or not a.held.covers(0, a.part.total):
            return None
        a.ended = a.released = True
        self._by_key.pop(a.key, None)
        a.write.temp.written = a.part.total
        try:
            stored = await a.write.commit(a.meta)
        except NezhaError as e:  # TooLarge among them
            log.warning("assembly_not_stored", key=a.key, error=str(e))
            await a.write.discard()
            return None
        self.counts.stored(stored, self.store.sizes())
        log.info("assembly_completed", key=a.key, bytes=stored.size)
        self.replicate(stored, a.target)
        return stored

    def holds(self, key: str) -> bool:
        """Whether parts of `key` are held (a fill stored whole asks before it awaits `forget`)."""
        return key in self._by_key

    async def forget(self, key: str, *, why: str) -> None:
        """Parts of `key` are of no use any more: a write superseded it, or a fill stored it whole."""
        a = self._by_key.get(key)
        if a is not None:
            await self._end(a, why=why)

    async def _tidy(self, now: float) -> None:
        """Give back the room of assemblies left idle; at the limit, the idlest one's."""
        idle = sorted((a for a in self._by_key.values() if not a.writers), key=lambda a: a.touched)
        for a in idle:
            if now - a.touched >= self._idle or len(self._by_key) >= self._limit:
                await self._end(a, why="idle" if now - a.touched >= self._idle else "room for another")

    async def _end(self, a: _Assembly, *, why: str) -> None:
        a.ended = True
        if self._by_key.get(a.key) is a:
            del self._by_key[a.key]
        log.info("assembly_dropped", key=a.key, held=a.held.held, bytes=a.part.total, reason=why)
        if not a.writers and not a.released:
            a.released = True
            await a.write.discard()
