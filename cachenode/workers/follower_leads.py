"""A follower's side of leading small cold fills (docs/cache-node.md, "Workers",
"Followers leading small cold fills"; the primary's: cachenode/workers/lead_desk.py).

A plain cold miss the fast path fully understands (the requests the
primary's `FastMisses.take` leads, less what only the primary can tell: a
flight under way, the ring) is not handed over at once: the follower asks
the primary for its lead. Denied, the connection goes to the primary as
before, nothing asked of the origin. Granted, the follower asks the origin
itself, on its own pool, and stores the answer only where that is exactly
what the primary would have stored at once: a 200 of a known length up to
the store's small objects' size, storable as `fill/lead.py` decides, not
varying, its published digest (if any) checked. It writes the sealed file
under its final name (`store/small.py` `write_sealed_file`), tells the
primary (`LeadDone`), which alone admits it to the index, and answers its
client from memory as a miss; the connection stays here.

Any other answer is declined: the origin's response is closed, the primary
told, and the connection handed over, so the primary asks the origin again
and answers as it always did. That second request is a declined lead's
cost; the primary grants leads only for origins whose recent fills were
small (cachenode/workers/lead_grant.py), so a dataset of large files stops
paying it after a few fills.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp
import structlog
from multidict import CIMultiDictProxy

from cachenode.app import origin_roots
from cachenode.fill.chunking import FIRST_CHUNK_UP_TO
from cachenode.fill.flights import Kind, Outcome, Source
from cachenode.fill.judged import judge
from cachenode.fill.lead import Step
from cachenode.fill.origin import Interim, OriginClient, fields_of
from cachenode.fill.verify import check_whole
from cachenode.front.fast_misses import Led, PlainFields, log_answered, miss_head, plain_cold
from cachenode.front.hits import Named
from cachenode.front.plain import PlainRequest
from cachenode.http.digests import expectations
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.store.small import record_of, sealed_meta
from cachenode.workers.channel import RECORD_LIMIT
from cachenode.workers.messages import Lead, LeadDone, encode
from nezha.config import CacheSettings
from nezha.credentials import redact_url
from nezha.errors import NezhaError
from nezha.keys import Target
from nezha.origins import Origin

log = structlog.get_logger("nezha.cachenode")

_DECLINED = Outcome(Kind.PASSED)  # what a declined lead hands over with: nothing, the primary asks again


@dataclass(frozen=True)
class Asked:
    """A plain cold miss this follower asks the lead of."""

    key: str
    url: str
    target: Target
    origin: Origin
    forwarded: CIMultiDictProxy[str]


class FollowerLeads:
    """The misses a follower's fast path leads (its `misses`, as the primary's `FastMisses`)."""

    def __init__(self, settings: CacheSettings, *, store: Store, via: str, send: Callable[..., bool],
                 missed: Callable[[str, int, float | None], None]) -> None:
        """`send`: a record to the primary (False: the link is gone); `missed`:
        a miss answered here, to count there."""
        self.settings = settings
        self.store = store
        self.via = via
        self._send = send
        self._missed = missed
        self.origins = OriginClient(connect_timeout=settings.origin_connect_timeout,
                                    read_timeout=settings.origin_read_timeout, roots=origin_roots(settings))
        self._fields = PlainFields(via)
        self._asks: dict[int, tuple[asyncio.Future[bool], str]] = {}  # an ask's number -> its answer, its key
        self._n = 0
        self._leading: set[str] = set()  # keys asked or led here: a second request for one is handed over
        self._log = log.is_enabled_for(logging.INFO)

    # -- before anything is asked ------------------------------------------------
    def take(self, req: PlainRequest, head: bytes | bytearray, scheme: str, named: Named | None) -> Asked | None:
        """The miss `req` if this follower asks its lead; None: handed over as before."""
        plain = plain_cold(req, head, scheme, named, self._fields, parent=self.settings.parent)
        if plain is None or plain.key in self._leading or self.store.lookup(plain.key, plain.headers) is not None:
            return None
        threshold, _ = self.settings.chunking(plain.origin)
        if 0 < threshold <= max(FIRST_CHUNK_UP_TO, self.store.small_max):
            return None  # the primary may ask such an origin for a first chunk: its fill, not this one
        self._leading.add(plain.key)
        return Asked(key=plain.key, url=plain.url, target=plain.target, origin=plain.origin, forwarded=plain.forwarded)

    # -- the lead ------------------------------------------------------------------
    async def lead(self, miss: Asked, *, interim: Interim) -> Outcome | Led:
        """The stored object and its body to answer with, or a `Led` whose
        connection the fast path hands to the primary (denied, or declined)."""
        try:
            if not await self._granted(miss):
                return Led(key=miss.key, outcome=_DECLINED, response=None)
            stored = await self._fill(miss, interim)
        finally:
            self._leading.discard(miss.key)
        if stored is None:
            return Led(key=miss.key, outcome=_DECLINED, response=None)
        return stored

    async def _granted(self, miss: Asked) -> bool:
        self._n += 1
        n = self._n
        answer = asyncio.get_running_loop().create_future()
        self._asks[n] = (answer, miss.key)
        try:
            if not self._send(Lead(n=n, key=miss.key, host=miss.target.host, path=miss.target.path)):
                return False  # the link is gone: nobody will answer
            return await answer
        except asyncio.CancelledError:
            if answer.done() and not answer.cancelled() and answer.result():
                self._send(LeadDone(key=miss.key))  # granted, then cancelled before it could lead: given back
            raise
        finally:
            if not answer.cancelled():  # cancelled: kept until the answer comes, which `granted` gives back
                self._asks.pop(n, None)

    def granted(self, n: int, ok: bool) -> None:
        """The primary's answer to ask `n`. A grant nobody waits for any more
        (its request ended meanwhile) is given straight back: the primary
        would otherwise hold the key in flight for good."""
        asked = self._asks.pop(n, None)
        if asked is None:
            return
        answer, key = asked
        if not answer.done():
            answer.set_result(ok)
        elif ok:
            self._send(LeadDone(key=key))

    def lost(self) -> None:
        """The primary is gone: no ask will be answered, none is granted."""
        for answer, _ in self._asks.values():
            if not answer.done():
                answer.set_result(False)

    async def _fill(self, miss: Asked, interim: Interim) -> Outcome | None:
        """Ask the origin and store its answer if it is small and whole; None:
        declined. However it ends, the primary is told (`LeadDone`): with the
        object's record, or without (it leads the key itself)."""
        done = LeadDone(key=miss.key)
        try:
            try:
                response = await self.origins.request("GET", miss.url, headers=miss.forwarded,
                                                      what=f"origin {miss.url}", interim=interim)
            except NezhaError as e:
                return self._declined(miss, str(e))
            started = time.monotonic()
            stored: Outcome | LeadDone | None = None
            try:
                stored = await self._stored(miss, response)
            finally:
                if not isinstance(stored, Outcome):
                    response.close()  # not wanted: never back in the pool half read
                else:
                    response.release()  # read whole: its connection back in the pool
            if isinstance(stored, LeadDone):  # declined for what the answer is: the origin's objects are not small
                done, stored = stored, None
            elif stored is not None:
                assert stored.meta is not None
                done = LeadDone(key=miss.key, meta=record_of(stored.meta), seconds=time.monotonic() - started)
            return stored
        finally:
            self._send(done)

    async def _stored(self, miss: Asked, response: aiohttp.ClientResponse) -> Outcome | LeadDone | None:
        """`response` stored as the primary would store it at once; else
        declined: None, or the `LeadDone` saying the answer is no small object
        (which counts against its origin's grants, where a failure does not)."""
        length = response.content_length
        if response.status != 200 or length is None or not 0 < length <= self.store.small_max:
            self._declined(miss, f"answered {response.status}, {length} bytes: not a small object")
            return LeadDone(key=miss.key, large=True)
        judged = judge(response, origin=miss.origin, source=_SOURCE, stale=None, now=time.time(), fits=self.store.fits,
                       chunking=_never_chunked)
        if judged.decision.step is not Step.FILL or judged.vary != ():
            self._declined(miss, judged.decision.reason or "it varies")
            return LeadDone(key=miss.key, large=True)
        try:
            body = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return self._declined(miss, f"its body broke off: {e!r}")  # the primary asks again, and answers as ever
        if len(body) != length:
            return self._declined(miss, f"{len(body)} bytes of {length}")
        known = expectations(fields_of(response), status=200)
        expected = known.cheapest()
        if expected is not None and await check_whole(expected, body) is not None:
            return self._declined(miss, f"its body is not what {expected.field} says: the primary's fill reports it")
        policy = judged.policy
        meta = sealed_meta(length, key=miss.key, url=redact_url(miss.url, miss.origin.credential_params),
                           host=miss.target.host, headers=judged.kept, stored_at=judged.now, status=200,
                           expires_at=judged.expires_at, stale_if_error=policy.stale_if_error, age=judged.age,
                           stale_while_revalidate=policy.stale_while_revalidate)
        if len(encode(LeadDone(key=miss.key, meta=record_of(meta), seconds=0.0))) > RECORD_LIMIT:
            return self._declined(miss, "its record is larger than a link's record")  # the primary's fill sends none
        try:
            self.store.write_unadmitted(meta, body)
        except NezhaError as e:
            return self._declined(miss, str(e))
        if self._log:
            log.info("fill_completed", key=miss.key, bytes=length, source="origin", at_once=True, lead=True,
                     **({"verified": expected.field} if expected is not None else {}))
        return Outcome(Kind.STORED, meta=meta, body=body)

    def _declined(self, miss: Asked, reason: str) -> None:
        log.info("lead_declined", key=miss.key, reason=reason)
        return None

    # -- the answer ------------------------------------------------------------------
    def head(self, meta: Meta) -> bytes:
        return miss_head(meta, self.via)

    def answered(self, miss: Asked, meta: Meta, *, path: str, sent: int, ms: float, first_byte: float | None,
                 gone: bool = False) -> None:
        """Count (at the primary) and log a miss answered here, as the primary's fast misses do."""
        self._missed(meta.host, sent, first_byte)
        if self._log:
            log_answered(miss.key, miss.target.host, path, sent=sent, ms=ms, gone=gone)

    def unanswered(self, miss: Asked, led: Led, *, path: str, ms: float) -> None:
        """A client gone before its denied or declined miss was handed over: nobody answers it."""
        if self._log:
            log.info("client_gone", key=miss.key, bytes=0)


_SOURCE = Source(url="", what="origin", headers={})  # a plain origin's answer, to `judge`: not a peer's


def _never_chunked(vary: tuple[str, ...] | None, authorize: bool) -> tuple[None, int]:
    """Never chunked: `FollowerLeads.take` leads no miss of an origin that chunks at a small object's size."""
    return None, 0
