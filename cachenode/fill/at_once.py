"""A small fill stored at once: an answer whose body aiohttp read whole with
its head (`fill/lead.py` `stored_at_once`) is checked, written and sealed
under its final name on the event loop before any client is answered, then answered
from memory as a miss. No background task, no buffer its clients follow.

`fill/running.py` decides which answers come here (`FillRuns.whole_and_small`)
and takes back, as its general fill from memory, every body this path could
not store plainly; it is a module of its own because nothing of the
background fill's reading, splicing or ranges applies to it.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import aiohttp
import structlog

from cachenode.counts import Counts
from cachenode.fill.assembly import Assemblies
from cachenode.fill.flights import Flight, Flights, Kind, Outcome, Source
from cachenode.fill.judged import Judged
from cachenode.fill.origin import Answered, fields_of
from cachenode.fill.verify import DigestMismatch, Digests, check_whole
from cachenode.http.digests import Expected, Mismatch
from cachenode.http.vary import variant as variant_of
from cachenode.metrics import Metrics
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, NotStored
from nezha.config import Origin
from nezha.credentials import redact_url
from nezha.errors import NezhaError
from nezha.keys import Target

log = structlog.get_logger("nezha.cachenode")


class AtOnce:
    """Small answers whole in memory, stored before their clients are answered."""

    def __init__(self, *, store: Store, digests: Digests, counts: Counts, metrics: Metrics, flights: Flights,
                 parts: Assemblies, replicate: Callable[[Meta, Target], None]) -> None:
        """The collaborators of `FillRuns` this path uses, the same objects."""
        self.store = store
        self.digests = digests
        self.counts = counts
        self.metrics = metrics
        self.flights = flights
        self.parts = parts
        self.replicate = replicate  # a fill from the origin completed: copy it to the key's replicas
        # The histogram's children this path observes, looked up once, not per fill.
        self._stored_seconds = metrics.fill_duration.labels(source="origin", outcome="stored")
        self._failed_seconds = metrics.fill_duration.labels(source="origin", outcome="failed")
        # Whether `fill_completed` lines are written: a line is built at thousands of fills a second
        # otherwise for nothing. Set once before a node is made, as for fast hits (front/hits.py).
        self._log = log.is_enabled_for(logging.INFO)

    async def store_whole(self, flight: Flight, response: aiohttp.ClientResponse | Answered, body: bytes,
                          judged: Judged, *, key: str, url: str, target: Target, source: Source,
                          origin: Origin) -> Outcome | NotStored | None:
        """Store `body`, `response`'s whole body read already, at once, on the
        event loop: checked in memory against a published digest, then one
        file created under its final name and written with its seal in one go
        (cachenode/store/small.py `SealedWrites.put_sealed`), counted and
        logged as any fill; the flight's clients are then answered from the
        bytes in memory as a miss. `judged`: what the leader made of the
        answer (fill/judged.py): the fields stored, expiry, policy, Vary and
        Age, stored as they are rather than worked out again.

        The store's refusal (NotStored) when it would not keep it: the caller
        streams it to its clients unstored without asking the store again.
        None for anything else but a plain success: the caller hands the body to
        the general fill (`FillRuns.start`, from memory), which handles it as
        it handles every fill: a store that refuses or fails it streams it to
        its clients unstored; a write that superseded it stores nothing. A body
        that fails its digest is not stored and fails the flight (502 naming
        the mismatch: no byte of it leaves)."""
        started = time.monotonic()
        host, vary, policy = target.host, judged.vary, judged.policy
        length = len(body)
        verified: str | None = None
        expected = self.digests.expected(key=key, target=target, status=200, headers=fields_of(response))
        if expected is not None:
            mismatch = await self._check(expected, body)
            if mismatch is not None:
                return self._mismatched(flight, mismatch, key=key, url=url, host=host, length=length,
                                        started=started)
            verified = expected.field
        if flight.superseded:
            return None  # the general fill stores nothing of a superseded write (the caller's)
        try:
            stored = self.store.put_sealed(
                body, key=key, vary=vary, variant=variant_of(vary, source.headers) if vary else "",
                url=redact_url(url, origin.credential_params), host=host, headers=judged.kept, stored_at=judged.now,
                status=200, expires_at=judged.expires_at, stale_if_error=policy.stale_if_error,
                age=judged.age, stale_while_revalidate=policy.stale_while_revalidate,
                authorize=judged.authorize)
        except NotStored as e:
            # Refused or too large: the caller's fill streams it to its clients unstored and
            # does not ask the store again (a second ask would count a second miss in the policy).
            return e
        except NezhaError:
            return None  # the general fill meets the same failure and handles it (the caller's)
        if self.parts.holds(key):  # parts a signed ranged read brought: of no use now
            await self.parts.forget(key, why="stored whole by a fill")
        return self._completed(flight, stored, body, key=key, host=host, target=target, started=started,
                               verified=verified)

    async def _check(self, expected: Expected, body: bytes) -> Mismatch | None:
        """`body` checked against the digest its origin published (fill/verify.py),
        in memory, before anything of it is written (no descriptor kept open to
        read it back): what mismatched, or None. In flight for the gauge while
        it is checked, the one wait of this path (a large body's hash, on a
        thread); the rest runs on the loop at once, where no scrape can see the
        gauge between a rise and its fall, so it is not moved for it."""
        self.metrics.fills_in_flight.inc()
        try:
            return await check_whole(expected, body)
        finally:
            self.metrics.fills_in_flight.dec()

    def _mismatched(self, flight: Flight, mismatch: Mismatch, *, key: str, url: str, host: str, length: int,
                    started: float) -> Outcome:
        """Fail the flight of a body that is not what its origin published:
        counted as a failed fill whose bytes came from the origin, and its
        flight landed with nothing stored."""
        self._from_origin(host, length)
        error = DigestMismatch(f"{url} sent bytes for {key} that are not what it published: "
                               f"{mismatch}; nothing is stored", mismatch=mismatch)
        self.digests.mismatched(error, origin=host, key=key, source=url)
        self.counts.count(host, failed_fills=1)
        self._failed_seconds.observe(time.monotonic() - started)
        self.flights.land(flight)
        return Outcome(Kind.FAILED, error=error)

    def _completed(self, flight: Flight, stored: Meta, body: bytes, *, key: str, host: str, target: Target,
                   started: float, verified: str | None) -> Outcome:
        """Count, log and copy a body stored at once as any completed fill from
        the origin, and land its flight with the body its clients are answered from."""
        self._from_origin(host, len(body))
        seconds = time.monotonic() - started
        self._stored_seconds.observe(seconds)
        self.counts.stored(stored, self.store.sizes())
        if self._log:
            log.info("fill_completed", key=key, bytes=stored.size, source="origin", at_once=True,
                     seconds=round(seconds, 3), **({"verified": verified} if verified else {}))
        self.flights.land(flight)
        self.replicate(stored, target)
        return Outcome(Kind.STORED, meta=stored, body=body)

    def _from_origin(self, host: str, n: int) -> None:
        """Count `n` bytes a fill got from the origin (what `FillRuns._counter`'s `on_bytes` counts as they come)."""
        self.metrics.from_origin(n)
        self.counts.count(host, bytes_from_origin=n, metrics=False)
