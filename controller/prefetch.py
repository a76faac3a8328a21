"""Prefetch without CRDs: `nezha.io/prefetch: URL[,URL...]` on a Job fills the cache before the job reads.

The controller watches Jobs in every namespace (training jobs live in their
users' namespaces). For each URL a Job names, the first owner of its key
fills it, through the ordinary request path of a cache node, so the
allow-list and every other rule of the node still apply: the controller
asks that node for the object's first byte (`Range: bytes=0-0`). A fill
always fetches the whole object and runs on its own, so the one byte comes
back at once while the object keeps arriving; the controller then asks the
node (`HEAD`, `Cache-Control: only-if-cached`) until the object is stored,
and reads its size there. No object body crosses the controller.

Each URL is fetched once however many Jobs name it (one task per URL,
shared). Progress goes into the Job's `nezha.io/prefetch-status` annotation
(JSON: `total`, `done`, `failed` [{url, reason}], `bytes` stored so far) and
a Normal Event when all are done; each URL the cache refuses or the origin
fails gets a Warning Event naming it. A Job deleted mid-prefetch cancels
nothing: what was fetched stays cached.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit

import aiohttp
import structlog
from kubernetes_asyncio import client

from nezha.keys import BadTarget, key_for, parse_target
from nezha.ring import Ring
from controller.annotations import PREFETCH, parse_prefetch
from nezha.config import OriginTable
from nezha.wire import CACHE_HEADER, ORIGIN_ERROR_HEADER, PASSED_ON

if TYPE_CHECKING:
    from controller.events import EventRecorder

log = structlog.get_logger("nezha.controller.prefetch")

STATUS = "nezha.io/prefetch-status"


@dataclass
class Result:
    url: str
    ok: bool = False
    bytes: int = 0
    reason: str = ""


@dataclass
class JobProgress:
    urls: list[str]
    results: dict[str, Result] = field(default_factory=dict)
    bad: list[dict] = field(default_factory=list)  # URLs dropped by parse_prefetch
    announced: bool = False

    def status(self) -> dict:
        failed = self.bad + [{"url": r.url, "reason": r.reason} for r in self.results.values() if not r.ok]
        return {"total": len(self.urls) + len(self.bad), "done": sum(1 for r in self.results.values() if r.ok),
                "failed": failed, "bytes": sum(r.bytes for r in self.results.values() if r.ok)}

    @property
    def finished(self) -> bool:
        return len(self.results) == len(self.urls)


class Prefetcher:
    def __init__(self, *, api: client.ApiClient, events: "EventRecorder", session: Callable[[], aiohttp.ClientSession],
                 ring: Callable[[], tuple[Ring | None, dict[str, str]]], origins: OriginTable,
                 timeout: float = 3600.0, poll: float = 0.2, clock: Callable[[], float] = time.monotonic,
                 counted: Callable[[str], None] = lambda outcome: None) -> None:
        """`ring()` gives the current ring and node addresses; `session()` an HTTP client for the nodes;
        `origins` the nodes' origin table, whose rules make a URL's key; `counted(outcome)` is told how
        each URL ended (fetched, failed, refused: controller/metrics.py)."""
        self.batch = client.BatchV1Api(api)
        self.events = events
        self._session = session
        self._ring = ring
        self._origins = origins
        self.timeout = timeout
        self.poll = poll
        self._clock = clock
        self._counted = counted
        self.fetches: dict[str, asyncio.Task] = {}  # url -> the one fetch of it
        self.jobs: dict[str, JobProgress] = {}  # "ns/name" -> progress
        self._tasks: dict[str, asyncio.Task] = {}

    def observe(self, jobs: dict[str, dict]) -> None:
        """Start following every Job that names URLs and is not followed yet (level-based)."""
        for key, job in jobs.items():
            value = ((job.get("metadata") or {}).get("annotations") or {}).get(PREFETCH)
            if not value or key in self._tasks:
                continue
            urls, problems = parse_prefetch(value)
            progress = JobProgress(urls=urls, bad=[{"url": p.value, "reason": p.message} for p in problems])
            self.jobs[key] = progress
            self._tasks[key] = asyncio.get_running_loop().create_task(self._follow(key, job, progress))

    async def close(self) -> None:
        """Stop following every Job (leadership lost, or shutdown); a new leader starts over."""
        tasks = list(self._tasks.values()) + list(self.fetches.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self.fetches.clear()
        self.jobs.clear()

    async def _follow(self, key: str, job: dict, progress: JobProgress) -> None:
        for bad in progress.bad:
            self._counted("refused")
            await self.events.emit(job, "Warning", "PrefetchRefused", bad["reason"])
        await self._write_status(job, progress)
        waits = {url: self._fetch_once(url) for url in progress.urls}
        pending = set(waits.values())
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for url, task in waits.items():
                if task in done and url not in progress.results:
                    result = task.result()
                    progress.results[url] = result
                    self._counted("fetched" if result.ok else "failed")
                    if not result.ok:
                        await self.events.emit(job, "Warning", "PrefetchFailed",
                                               f"{PREFETCH}: {url}: {result.reason}")
            await self._write_status(job, progress)
        status = progress.status()
        await self.events.emit(job, "Normal", "PrefetchDone",
                               f"prefetched {status['done']} of {status['total']} URLs, {status['bytes']} bytes"
                               + (f"; {len(status['failed'])} failed" if status["failed"] else ""))
        log.info("prefetch_done", job=key, **{k: v for k, v in status.items() if k != "failed"},
                 failed=len(status["failed"]))

    def _fetch_once(self, url: str) -> asyncio.Task:
        task = self.fetches.get(url)
        if task is None or (task.done() and not task.result().ok):
            task = self.fetches[url] = asyncio.get_running_loop().create_task(self._fetch(url))
        return task

    async def _fetch(self, url: str) -> Result:
        """Have the key's first owner fill `url`; Result says whether it is stored, and its size."""
        parts = urlsplit(url)
        try:
            target = parse_target(url, parts.netloc)
        except BadTarget as e:
            return Result(url, reason=f"not a URL the cache serves: {e}")
        ring, addresses = self._ring()
        if ring is None or not addresses:
            return Result(url, reason="the cache has no ring yet")
        owner = ring.owners(key_for(target, self._origins.get(target.host)), 1)[0]
        node = f"http://{addresses[owner]}"
        session = self._session()
        # The absolute-URI form names the object; the node applies its own allow-list.
        headers = {"Host": target.host}
        path = target.path_qs
        deadline = self._clock() + self.timeout
        try:
            async with session.get(node + path, headers={**headers, "Range": "bytes=0-0"}) as r:
                await r.read()
                if r.headers.get(CACHE_HEADER) in PASSED_ON:
                    return Result(url, reason=f"{owner} passed it through: the origin's answer may not be stored")
                if r.status >= 400:
                    reason = r.headers.get(ORIGIN_ERROR_HEADER) or (await r.text())[:200].strip() or r.reason
                    return Result(url, reason=f"{owner} answered {r.status}: {reason}")
            while self._clock() < deadline:
                async with session.head(node + path, headers={**headers, "Cache-Control": "only-if-cached"}) as r:
                    if r.status == 200:
                        return Result(url, ok=True, bytes=int(r.headers.get("Content-Length") or 0))
                await asyncio.sleep(self.poll)
            return Result(url, reason=f"not stored on {owner} within {self.timeout:g}s")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return Result(url, reason=f"{owner} could not be asked: {type(e).__name__}: {e}")

    async def _write_status(self, job: dict, progress: JobProgress) -> None:
        if not self.events.allowed():
            return  # not the leader (any more): a standby writes nothing
        meta = job.get("metadata") or {}
        text = json.dumps(progress.status(), sort_keys=True, separators=(",", ":"))
        try:
            await self.batch.patch_namespaced_job(meta["name"], meta["namespace"],
                                                  {"metadata": {"annotations": {STATUS: text}}})
        except Exception as e:  # noqa: BLE001 - the Job may be gone; what was fetched stays cached
            log.info("prefetch_status_not_written", job=f"{meta.get('namespace')}/{meta.get('name')}",
                     error=f"{type(e).__name__}: {str(e)[:200]}")
