"""Prefetch without CRDs: `nezha.io/prefetch` on a workload fills the cache before its pods read.

The controller watches the workloads that start pods in every namespace
(they live in their users' namespaces): Jobs, Deployments, StatefulSets,
and LeaderWorkerSets and JobSets where their CRDs are installed
(controller/workloads.py). Each entry of the annotation is an object's URL or a
name (`hf://ORG/REPO[@REV]`, `s3://BUCKET/PREFIX`, an index page, a
manifest: nezha/prefetch/names.py), expanded into object URLs first
(controller/expand.py). A name that expands to a host outside the origin
table is refused whole, with a Warning Event naming it and the hosts:
nothing of it is fetched.

For each URL, the first owner of its key fills it, through the ordinary
request path of a cache node, so the allow-list and every other rule of the
node still apply: the controller asks that node for the object's first byte
(`Range: bytes=0-0`). A fill always fetches the whole object and runs on
its own, so the one byte comes back at once while the object keeps
arriving; the controller then asks the node (`HEAD`, `Cache-Control:
only-if-cached, max-stale`) until the object is stored, and reads its
size there. No
object body crosses the controller. An https URL is asked as a peer relays
one (`X-Nezha-Peer`, the cluster token, `X-Nezha-Scheme: https`), so it is
stored under the https key the clients of the TLS port read. A redirect
(the Hub's `resolve` answers one for every file) is followed as a client
follows it, up to MAX_REDIRECTS, when its target's host is an origin;
redirects are not stored (docs/http-semantics.md), their targets are.

Each object is fetched once however many workloads name it (one task per
cache key, shared; two signed URLs of one object are one key). At most
`fills` fetches run at once on a node (`--prefetch-fills`): each batch
says so, and the node holds the rest of what it was named until a slot is
free. The controller names at most ASKED_PER_FILL × `fills` objects at once
across every workload, so that a node always has the next one at hand: a
fill stored there starts the next at once, not a round trip to the
controller later (with no more named than may run, the benchmark's
origin saw 7 to 10 of 16 fills in flight; docs/benchmarks.md, "Every fill
slot kept busy"). Objects asked the ordinary way, and copies, hold one of
`fills` slots here besides. Every request is marked `X-Nezha-Prefetch`
(`fill`, then `check`): the node runs them behind its live traffic
(cachenode/front/pacing.py), so a large expansion never starves the tier.
Progress goes into the workload's `nezha.io/prefetch-status` annotation
(JSON: `total`, `done`, `failed` [{url, reason}], `bytes` stored so far,
`expanded_from` [{name, objects, ...}]), written at most every
STATUS_EVERY seconds and once at the end, and a Normal Event when all are
done; each URL the cache refuses or the origin fails gets a Warning Event
naming it. A workload deleted mid-prefetch cancels nothing: what was
fetched stays cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable
from urllib.parse import urljoin, urlsplit

import aiohttp
import structlog
from kubernetes_asyncio import client

from controller import workloads
from controller.annotations import (PREFETCH, PREFETCH_KEEP, PREFETCH_SECRET, PREFETCH_SPREAD, PREFETCH_STATUS,
                                   parse_prefetch, read_keep, read_spread, secret_problem)
from controller.expand import Auth, Expander, ExpandFailed, NotAnOrigin
from controller.prefetch_batches import FillBatches
from controller.prefetch_fills import NodeFills, Result, StoredBatch, _Redirect
from controller.prefetch_pins import Pinning
from controller.prefetch_spread import Spreading
from controller.sources import SecretUnreadable, read_credentials
from nezha.config import OriginTable
from nezha.prefetch.names import BadName, ObjectUrl, parse_name
from nezha.ring import Ring

if TYPE_CHECKING:
    from controller.events import EventRecorder

log = structlog.get_logger("nezha.controller.prefetch")

STATUS = PREFETCH_STATUS
MAX_REDIRECTS = 5
# URLs asked of the nodes at once, per fill that may run there: the next ones wait on the node for a slot.
ASKED_PER_FILL = 2
STATUS_EVERY = 1.0  # seconds between two status writes of one workload while it fills
FAILED_SHOWN = 100  # failures listed in the status; the rest are counted in `failed_more`


@dataclass
class JobProgress:
    urls: list[str] = field(default_factory=list)
    results: dict[str, Result] = field(default_factory=dict)
    bad: list[dict] = field(default_factory=list)  # entries dropped by parse_prefetch, names refused or unread
    expanded_from: list[dict] = field(default_factory=list)
    expanding: bool = True
    pinned: int | None = None  # bytes kept from eviction for the workload, once asked
    notes: list[str] = field(default_factory=list)  # problems of the annotations beside nezha.io/prefetch
    spread: bool = False  # nezha.io/prefetch-spread: all
    spread_done: dict | None = None  # {"objects", "copies", "failed"} once spread
    taken: int = 0  # URLs a worker has taken up (asked for, or waiting for a slot)
    times: dict[str, float] = field(default_factory=dict)  # when each step was reached (the prefetch_done log)

    def status(self) -> dict:
        failed = self.bad + [{"url": r.url, "reason": r.reason} for r in self.results.values() if not r.ok]
        out = {"total": len(self.urls) + len(self.bad), "done": sum(1 for r in self.results.values() if r.ok),
               "failed": failed[:FAILED_SHOWN], "bytes": sum(r.bytes for r in self.results.values() if r.ok)}
        if len(failed) > FAILED_SHOWN:
            out["failed_more"] = len(failed) - FAILED_SHOWN
        if self.expanded_from:
            out["expanded_from"] = self.expanded_from
        if self.pinned is not None:
            out["pinned"] = self.pinned
        if self.spread_done is not None:
            out["spread"] = self.spread_done
        return out

    @property
    def finished(self) -> bool:
        return not self.expanding and len(self.results) == len(self.urls)


class Prefetcher(NodeFills, Spreading, Pinning):
    def __init__(self, *, api: client.ApiClient, events: "EventRecorder", session: Callable[[], aiohttp.ClientSession],
                 ring: Callable[[], tuple[Ring | None, dict[str, str]]], origins: OriginTable,
                 timeout: float = 3600.0, poll: float = 0.2, clock: Callable[[], float] = time.monotonic,
                 counted: Callable[[str], None] = lambda outcome: None, fills: int = 16,
                 expander: Expander | None = None, cluster_token: str | None = None,
                 s3_region: str = "us-east-1",
                 record_pins: Callable[[str, int, float | None], Awaitable[None]] | None = None,
                 spread_max: int = 1 << 30, spread_over: Callable[[], None] = lambda: None) -> None:
        """`ring()` gives the current ring and node addresses; `session()` an HTTP client for the nodes;
        `origins` the nodes' origin table, whose rules make a URL's key; `counted(outcome)` is told how
        each URL ended (fetched, failed, refused: controller/metrics.py); `fills` bounds the fetches in
        flight across every workload; `expander` reads the listings names expand through."""
        self.api = api
        self.events = events
        self._session = session
        self._ring = ring
        self._origins = origins
        self.timeout = timeout
        self.poll = poll
        self._clock = clock
        self._counted = counted
        self.fills = fills
        self.expander = expander or Expander(session=session, origins=origins)
        self._cluster_token = cluster_token
        self.s3_region = s3_region
        self._record_pins = record_pins  # nezha/index/pins.py: the account `nezha stats` shows
        self.spread_max = spread_max
        self._spread_over = spread_over  # told when a workload's spread is done: its pods may go (gates.py)
        self._slots: asyncio.Semaphore | None = None  # `fills`: the ordinary way's fills, copies
        self._asks: asyncio.Semaphore | None = None  # ASKED_PER_FILL x `fills`: every object asked of a node
        self.in_flight = 0
        self.most_in_flight = 0
        self.waiting = 0  # objects waiting to be asked, copies waiting for a slot
        self.fetches: dict[str, asyncio.Task] = {}  # cache key -> the one fetch of it
        self._stored_batches: dict[str, StoredBatch] = {}  # node address -> its objects asked about together
        self._fill_batches: dict[str, FillBatches] = {}  # node address -> its public objects' fills, sent together
        self.jobs: dict[str, JobProgress] = {}  # "Kind/ns/name" -> progress
        self._tasks: dict[str, asyncio.Task] = {}
        # "Kind/ns/name" -> (uid, annotation, secret annotation) followed
        self._asked: dict[str, tuple[str | None, str, str | None]] = {}
        self._keep: dict[str, float] = {}  # "Kind/ns/name" -> its nezha.io/prefetch-keep, for when it ends
        self._pinned: dict[str, int] = {}  # "Kind/ns/name" -> bytes pinned for it
        self._releases: set[asyncio.Task] = set()

    def queued(self) -> int:
        """Objects of the workloads followed now that wait for a fill: not yet taken up by a worker, or
        waiting for a slot (the `nezha_controller_prefetch_fills{state="queued"}` gauge)."""
        return sum(max(0, len(p.urls) - p.taken) for p in self.jobs.values()) + self.waiting

    @property
    def asked_at_once(self) -> int:
        """Objects asked of the nodes at once, at most: twice what may run, so none waits for a round trip."""
        return ASKED_PER_FILL * max(1, self.fills)

    def _fill_slot(self) -> asyncio.Semaphore:
        """One of `fills`, held by a fill asked the ordinary way (whose node is told no bound)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, self.fills))
        return self._slots

    @contextlib.asynccontextmanager
    async def _waiting_for(self, slots: asyncio.Semaphore):
        """One of `slots`, counted in `waiting` until it is had."""
        self.waiting += 1
        try:
            await slots.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            slots.release()

    def observe(self, objects: dict[str, dict]) -> None:
        """Follow every workload (by "Kind/ns/name") that names what to prefetch (level-based): a new one,
        one whose annotation changed, one deleted and made again (a new uid). A workload gone is no longer
        followed; the fills it started go on (another may share them), and what they store stays."""
        for key in list(self._asked):
            if key not in objects or not self._annotation(objects[key]):
                self._forget(key)
        for key, obj in objects.items():
            value = self._annotation(obj)
            secret = ((obj.get("metadata") or {}).get("annotations") or {}).get(PREFETCH_SECRET)
            asked = ((obj.get("metadata") or {}).get("uid"), value, secret)
            if not value or self._asked.get(key) == asked:
                continue
            self._forget(key)
            entries, problems = parse_prefetch(value)
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            keep, problem = read_keep(annotations.get(PREFETCH_KEEP))
            self._keep[key] = keep
            spread, spread_problem = read_spread(annotations.get(PREFETCH_SPREAD))
            problems += [p for p in (problem, spread_problem) if p is not None]
            progress = JobProgress(bad=[{"url": p.value, "reason": p.message} for p in problems
                                        if p.keys == (PREFETCH,)])
            progress.spread = spread
            for p in problems:
                if p.keys != (PREFETCH,):
                    progress.notes.append(p.message)
            self.jobs[key] = progress
            self._asked[key] = asked
            self._tasks[key] = asyncio.get_running_loop().create_task(self._follow(key, obj, entries, progress))

    @staticmethod
    def _annotation(obj: dict) -> str | None:
        return ((obj.get("metadata") or {}).get("annotations") or {}).get(PREFETCH)

    def _forget(self, key: str) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()  # its fills are shielded: they go on
        self._asked.pop(key, None)
        self.jobs.pop(key, None)
        keep = self._keep.pop(key, None)
        if keep is not None:
            # Gone, or asking for something else now: what it pinned is kept `keep` more seconds.
            release = asyncio.get_running_loop().create_task(self._release(key, keep))
            self._releases.add(release)
            release.add_done_callback(self._releases.discard)

    async def close(self) -> None:
        """Stop following every Job (leadership lost, or shutdown); a new leader starts over."""
        tasks = list(self._tasks.values()) + list(self.fetches.values()) + list(self._releases) + \
            [b.task for b in self._stored_batches.values() if b.task is not None] + \
            [t for b in self._fill_batches.values() for t in b.cancel()]
        self._stored_batches.clear()
        self._fill_batches.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self.fetches.clear()
        self.jobs.clear()
        self._asked.clear()
        self._keep.clear()

    # -- one workload ----------------------------------------------------------

    async def _follow(self, key: str, job: dict, entries: list[str], progress: JobProgress) -> None:
        began, progress.times["began_at"] = self._clock(), time.time()
        for bad in progress.bad:
            self._counted("refused")
            await self.events.emit(job, "Warning", "PrefetchRefused", bad["reason"])
        for note in progress.notes:
            await self.events.emit(job, "Warning", "InvalidAnnotation", note)
        auth, why = await self._credentials(job)
        if why is not None:
            # Meant to be read with credentials it cannot have: none of it is asked for without them.
            progress.bad += [{"url": entry, "reason": why} for entry in entries]
            self._counted("failed")
            log.warning("prefetch_secret_unreadable", job=key, error=why)
            await self.events.emit(job, "Warning", "PrefetchFailed", why)
            entries = []
        await self._expand(job, entries, progress, auth)
        progress.expanding = False
        progress.times["expanded_s"] = self._clock() - began
        await self._fill_all(job, progress, auth, began)
        await self._pin(key, job, progress)
        if progress.spread:
            await self._spread(key, job, progress)
            self._spread_over()
        await self._write_status(job, progress)
        status = progress.status()
        failed = len(status["failed"]) + status.get("failed_more", 0)
        await self.events.emit(job, "Normal", "PrefetchDone",
                               f"prefetched {status['done']} of {status['total']} URLs, {status['bytes']} bytes"
                               + (f"; {failed} failed" if failed else ""))
        progress.times["done_s"] = self._clock() - began
        log.info("prefetch_done", job=key, total=status["total"], done=status["done"], bytes=status["bytes"],
                 failed=failed, **{k: round(v, 4) for k, v in progress.times.items()})

    async def _fill_all(self, job: dict, progress: JobProgress, auth: Auth | None, began: float) -> None:
        """Every URL of the workload fetched (or failed), `asked_at_once` at a time; the status written at
        most every STATUS_EVERY seconds meanwhile."""
        written_at = -STATUS_EVERY
        await self._write_status(job, progress)
        queue = iter(progress.urls)
        changed = asyncio.Event()

        async def worker() -> None:
            for url in queue:
                progress.taken += 1
                # Shielded: the fill may be another workload's too, and outlives this one's deletion.
                result = await asyncio.shield(self._fetch_once(url, auth))
                progress.results[url] = result
                progress.times.setdefault("first_ended_s", self._clock() - began)
                progress.times["last_ended_s"] = self._clock() - began
                self._counted("fetched" if result.ok else "failed")
                if not result.ok:
                    await self.events.emit(job, "Warning", "PrefetchFailed", f"{PREFETCH}: {url}: {result.reason}")
                changed.set()

        workers = [asyncio.get_running_loop().create_task(worker()) for _ in range(self.asked_at_once)]
        try:
            while not all(w.done() for w in workers):
                changed.clear()
                waiter = asyncio.ensure_future(changed.wait())
                await asyncio.wait([waiter, *workers], timeout=STATUS_EVERY, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if self._clock() - written_at >= STATUS_EVERY:
                    written_at = self._clock()
                    await self._write_status(job, progress)
            for w in workers:
                w.result()
        finally:
            for w in workers:
                w.cancel()

    async def _credentials(self, job: dict) -> tuple[Auth | None, str | None]:
        """The workload's `nezha.io/prefetch-secret` as an Auth (controller/sources.py), or why it cannot be."""
        meta = job.get("metadata") or {}
        name = (meta.get("annotations") or {}).get(PREFETCH_SECRET)
        if name is None:
            return None, None
        problem = secret_problem(name)
        if problem is not None:
            return None, f"{problem.message}; nothing prefetched"
        try:
            found = await read_credentials(self.api, meta["namespace"], name.strip())
        except SecretUnreadable as e:
            return None, f"{PREFETCH_SECRET}: {e}; nothing prefetched"
        log.info("prefetch_secret_read", secret=found.secret, hf_token=found.hf_token is not None,
                 aws=found.aws is not None)
        return found.auth(hub_host=self.expander.hub_host, s3_host=self.expander.s3_host,
                          region=self.s3_region), None

    async def _expand(self, job: dict, entries: list[str], progress: JobProgress, auth: Auth | None) -> None:
        """Each entry's URLs into `progress.urls` (in order, each once); a name refused or unread goes to `bad`."""
        seen: set[str] = set()
        for entry in entries:
            try:
                name = parse_name(entry)
            except BadName as e:  # parse_prefetch checked it; kept for a caller that did not
                progress.bad.append({"url": entry, "reason": f"{PREFETCH}: {entry}: {e}"})
                continue
            if isinstance(name, ObjectUrl):
                urls = [name.url]
            else:
                try:
                    expansion = await self.expander.expand(name, auth=auth)
                except NotAnOrigin as e:
                    reason = f"{PREFETCH}: {entry} {e}; nothing of it prefetched"
                    progress.bad.append({"url": entry, "reason": reason})
                    self._counted("refused")
                    log.warning("prefetch_name_refused", name=entry, hosts=e.hosts)
                    await self.events.emit(job, "Warning", "PrefetchRefused", reason)
                    continue
                except ExpandFailed as e:
                    reason = f"{PREFETCH}: {entry}: {e}"
                    progress.bad.append({"url": entry, "reason": reason})
                    self._counted("failed")
                    log.warning("prefetch_name_unread", name=entry, error=str(e))
                    await self.events.emit(job, "Warning", "PrefetchFailed", reason)
                    continue
                urls = expansion.urls
                progress.expanded_from.append({"name": entry, "objects": len(urls), **expansion.note})
                log.info("prefetch_name_expanded", name=entry, objects=len(urls), **expansion.note)
            for url in urls:
                if url not in seen:
                    seen.add(url)
                    progress.urls.append(url)

    # -- one object ------------------------------------------------------------

    def _fetch_once(self, url: str, auth: Auth | None = None, chain: tuple[str, ...] = ()) -> asyncio.Future:
        """The one fetch of `url`'s object (by cache key, and by the credentials it is asked with: a fill
        one workload's Secret may make is not another's to wait on), started if none is running or the
        last failed. `chain`: the keys of the redirects that led here, so a loop fails instead of waiting
        on itself."""
        key = self._key(url)
        if key is None or key in chain:
            done = asyncio.get_running_loop().create_future()
            done.set_result(Result(url, reason="redirects in a loop" if key else "not a URL the cache serves"))
            return done
        shared = key if auth is None else f"{key}#{id(auth)}"
        task = self.fetches.get(shared)
        if task is None or (task.done() and not task.result().ok):
            task = self.fetches[shared] = asyncio.get_running_loop().create_task(
                self._fetch(url, auth, (*chain, key)))
        return task

    async def _fetch(self, url: str, auth: Auth | None = None, chain: tuple[str, ...] = ()) -> Result:
        """Have the key's first owner fill `url` (following a redirect); Result says whether it is stored."""
        if self._asks is None:
            self._asks = asyncio.Semaphore(self.asked_at_once)
        async with self._waiting_for(self._asks):
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                answer = await self._ask(url, auth)
            finally:
                self.in_flight -= 1
        if not isinstance(answer, _Redirect):
            return answer
        # The slot is given back first: the target's fetch takes one of its own.
        location = urljoin(url, answer.location)
        host = (urlsplit(location).hostname or "").rstrip(".")
        if len(chain) > MAX_REDIRECTS:
            return Result(url, reason=f"more than {MAX_REDIRECTS} redirects (last to {location})")
        if host not in self._origins:
            return Result(url, reason=f"redirected to {host or location}, which is not in the origin table")
        result = await asyncio.shield(self._fetch_once(location, auth, chain))
        return Result(url, ok=result.ok, bytes=result.bytes, reason=result.reason, key=result.key,
                      owner=result.owner)

    async def _write_status(self, job: dict, progress: JobProgress) -> None:
        if not self.events.allowed():
            return  # not the leader (any more): a standby writes nothing
        meta = job.get("metadata") or {}
        text = json.dumps(progress.status(), sort_keys=True, separators=(",", ":"))
        try:
            await workloads.patch_annotations(self.api, job, {STATUS: text})
        except Exception as e:  # noqa: BLE001 - the workload may be gone; what was fetched stays cached
            log.info("prefetch_status_not_written", kind=job.get("kind"),
                     job=f"{meta.get('namespace')}/{meta.get('name')}", error=f"{type(e).__name__}: {str(e)[:200]}")
