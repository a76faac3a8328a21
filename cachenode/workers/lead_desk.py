"""The primary's side of followers leading small cold fills (docs/cache-node.md,
"Followers leading small cold fills").

With every fill the primary's, a first epoch of small files runs at what one
process's CPU buys, whatever the node's worker count. So a follower meeting
a plain cold miss asks here for the lead of its key (`Lead`), and this desk
grants it (`Granted`) only where the follower's fill can be exact
(`lead_grant.may_grant`): no flight of the key under way, nothing stored
under it, this node its first owner, no digest a redirect named for it
(kept here, where the redirect was fetched), and the origin's recent fills
small.

A granted key is in flight here, as if the primary led it: a request for it
that reaches the primary (its own, or one a follower hands over) joins that
flight and waits. The follower's outcome lands it (`LeadDone`): an object
whose sealed file the follower wrote is admitted to the store here, where
capacity, eviction, Redis and replication are decided, and the flight's
joiners are answered from it (`miss-joined`, as a fill stored at once); a declined lead (an answer that is
not small and cacheable, an origin's failure) aborts the flight, and its
joiners lead a fill of their own. A follower whose link closes loses its
leads the same way (`gone`).

An origin no fill has shown yet is probed, not guessed: the first ask for
it is denied, so its connection goes to the primary, whose fill shows
whether the origin's objects are small; asks that come meanwhile are held
(`HOLD_SECONDS` at most) and answered once one has. A dataset's first
epoch starts with every loader connection asking at once on every worker:
denied, each follower's connection would stay with the primary for the
whole epoch (a cold connection reads no hits to come back for), and
granted blindly, a lead of a large object would ask the origin for it twice.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import structlog

from cachenode.fill.engine import LeaderGone
from cachenode.fill.flights import Flight, Kind, Outcome
from cachenode.store.objects import Meta, NotStored
from cachenode.store.small import well_named
from cachenode.workers.index_feed import meta_from
from cachenode.workers.lead_grant import Leads, may_grant
from cachenode.workers.messages import Granted, Message
from nezha.keys import target_of

log = structlog.get_logger("nezha.workers")

HOLD_SECONDS = 1.0  # an ask held for an origin being probed; denied if no fill of it has shown by then
_RECHECK_SECONDS = 0.005


class LeadDesk:
    """Grants, holds and lands the leads followers ask for; one per primary."""

    def __init__(self, node, *, send: Callable[[int, Message], None],
                 outcome: Callable[[str], None] = lambda outcome: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`node`: the primary's (cachenode/node.py). `send`: a record to a
        follower (its answer to an ask held a while). `outcome`: told how each
        ask ended (denied, stored, declined, refused, lost), for the metric."""
        self._send = send
        self._clock = clock
        self._probed: dict[str, float] = {}  # an origin being probed -> since when
        self._held: dict[str, list[tuple[int, int, str, str]]] = {}  # its held asks: (worker, n, key, path)
        self._recheck: asyncio.TimerHandle | None = None
        self.engine = node.engine
        self.store = node.store
        self.cluster = node.cluster
        self.node_id = node.node_id
        self.counts = node.counts
        self.metrics = node.metrics
        self.parent = node.upstream.parent
        # Each origin's last fills, the primary's own (kept by its fast misses) and its followers';
        # None with `follower_leads` off, when no follower asks.
        self.recent = node.handler.misses.recent if node.settings.follower_leads else None
        self.leads = Leads()
        self._flights: dict[str, tuple[Flight, str]] = {}  # a granted key -> its flight here, its origin's host
        self._outcome = outcome
        self._stored_seconds = node.metrics.fill_duration.labels(source="origin", outcome="stored")

    # -- an ask --------------------------------------------------------------------
    def asked(self, worker: int, n: int, key: str, host: str, path: str) -> bool | None:
        """Whether `worker` may lead the fill of `key` (granted, the key is in
        flight here from now); None: held while its origin is probed, answered later."""
        self.counts.live.seen()  # a client's miss, on a follower: live traffic for the prefetch pacing
        if self.recent is None or self.store.loading:
            # Without the flag; or while the start-up scan loads the index, where
            # a variant or a copy on disk not loaded yet is the primary's to find.
            self._outcome("denied")
            return False
        if not self.recent.seen(host) and self._eligible(key, host, path):
            if host in self._probed:
                self._held.setdefault(host, []).append((worker, n, key, path))
                self._soon()
                return None
            self._probed[host] = self._clock()  # denied: the primary's fill of it shows what the origin holds
        return self._decide(worker, key, host, path)

    def _decide(self, worker: int, key: str, host: str, path: str) -> bool:
        granted = self._eligible(key, host, path) and may_grant(
            self.recent, host, in_flight=self.engine.flights.get(key) is not None, stored=self._stored(key))
        if not granted or not self.leads.take(key, worker):
            self._outcome("denied")
            return False
        flight, _ = self.engine.flights.lead_or_join(key)
        self._flights[key] = (flight, host)
        return True

    def _eligible(self, key: str, host: str, path: str) -> bool:
        """What of the grant does not depend on the origin's recent fills: this
        node the key's first owner, no parent tier, no digest a redirect named for it."""
        owners = self.cluster.owners(key)
        return (not owners or owners[0].id == self.node_id) and self.parent is None and self._unlinked(host, path)

    def _soon(self) -> None:
        if self._recheck is None:
            self._recheck = asyncio.get_running_loop().call_later(_RECHECK_SECONDS, self._answer_held)

    def _answer_held(self) -> None:
        """Answer the asks held for each origin a fill has shown since, or
        probed for too long (denied then; its next ask probes again)."""
        self._recheck = None
        now = self._clock()
        for host in list(self._held):
            seen = self.recent.seen(host)
            if not seen and now - self._probed.get(host, now) < HOLD_SECONDS:
                continue
            self._probed.pop(host, None)
            for worker, n, key, path in self._held.pop(host):
                ok = seen and self._decide(worker, key, host, path)
                if not seen:
                    self._outcome("denied")
                self._send(worker, Granted(n=n, ok=ok))
        if self._held:
            self._soon()

    def _stored(self, key: str) -> bool:
        """Whether anything is stored under `key`: a response that does not vary, or variants."""
        return self.store.lookup(key) is not None or self.store.index.varies(key)

    def _unlinked(self, host: str, path: str) -> bool:
        """No redirect fetched here named a digest for this target (fill/verify.py `Digests.linked`):
        the follower could not check it, so the primary's own fill does."""
        digests = self.engine.runs.digests
        return digests is None or not digests.has_linked(host, path)

    # -- its end -------------------------------------------------------------------
    def done(self, worker: int, key: str, raw: dict | None, seconds: float, *, large: bool = False) -> None:
        """`worker`'s lead of `key` ended: `raw`, the record of the object it
        wrote, admitted and its flight's joiners answered from it; None,
        declined: the flight aborted, its joiners lead (`large`: declined for
        what the answer was, which counts against its origin's grants; a
        failure does not, as the primary's own failed fills do not). An end from a lead
        released already (its link closed meanwhile) is not obeyed, and its
        file is deleted: nothing will name it."""
        try:
            meta = meta_from(raw) if raw is not None else None
            if meta is not None and (meta.key != key or not well_named(meta)):
                raise ValueError(f"its record names {meta.data!r} for {meta.key!r}: not a sealed file of {key}")
        except (TypeError, ValueError) as e:  # not a record this version reads: declined, its joiners lead
            log.error("worker_record_malformed", worker=worker, key=key, error=str(e))
            meta = None
        if not self.leads.release(key, worker):
            if meta is not None:
                self.store.drop_sealed(meta)
            return
        flight, host = self._flights.pop(key)
        if meta is None:
            if large:
                self.recent.record(host, small=False)
            self._outcome("declined")
            self.engine.flights.abort(flight, LeaderGone(f"worker {worker} declined the lead of {key}"))
            return
        if flight.superseded:  # a write to the URL succeeded meanwhile: what the lead got is not stored
            self.store.drop_sealed(meta)
            self._outcome("refused")
            self.engine.flights.abort(flight, LeaderGone(f"{key} was written while worker {worker} led its fill"))
            return
        try:
            stored = self.store.admit_sealed(meta)
        except Exception as e:  # refused (NotStored), or a fault: never a flight left for its joiners to wait on
            if not isinstance(e, NotStored):  # a fault: its file goes (a refusal's went already)
                log.exception("lead_not_admitted", key=key, worker=worker)
                self.store.drop_sealed(meta)
            else:
                log.info("lead_not_admitted", key=key, worker=worker, reason=str(e))
            self._outcome("refused")
            self.engine.flights.abort(flight, LeaderGone(f"the store did not keep {key} from worker {worker}: {e}"))
            return
        self.recent.record(stored.host, small=True)
        self._outcome("stored")
        self._completed(flight, stored, seconds)

    def _completed(self, flight: Flight, stored: Meta, seconds: float) -> None:
        """Count a follower's fill as the primary counts one stored at once
        (fill/at_once.py `AtOnce._completed`), land its flight for its joiners,
        and have the key's other owners copy it."""
        self.metrics.bytes_from_origin.inc(stored.size)
        self.counts.count(stored.host, bytes_from_origin=stored.size, metrics=False)
        self._stored_seconds.observe(seconds)
        self.counts.stored(stored, self.store.sizes())
        self.engine.flights.land(flight)
        flight.resolve(Outcome(Kind.STORED, meta=stored))
        self.engine.replicate(stored, target_of(stored.key))

    def gone(self, worker: int) -> None:
        """`worker`'s link closed: every lead it held is lost, and their joiners lead; its held asks are dropped."""
        for host, asks in list(self._held.items()):
            asks[:] = [ask for ask in asks if ask[0] != worker]
            if not asks:
                del self._held[host]
        for key in self.leads.release_worker(worker):
            flight, _ = self._flights.pop(key)
            self._outcome("lost")
            self.engine.flights.abort(flight, LeaderGone(f"worker {worker} leading {key} is gone"))

