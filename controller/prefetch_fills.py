"""How the controller has a cache node fill one object, and learns that it is stored.

A public object goes in its owner's next batch of fills (`/_nezha/prefetch`,
controller/prefetch_batches.py): the node fills it and says when it is
stored, in one line of one request for many. What the batch cannot say (a
node without the endpoint, an object it hands back) goes the ordinary way:
the node is asked for the object's first byte (a public object) or for the
whole object, let go once its head is in (a signed one: a signed Range would
be kept as a part, not filled); then asked until the object is stored: a
public one together with the others that node filled meanwhile
(`/_nezha/stored`, one request for many), and while that says "not yet",
or for a signed one, by itself with `only-if-cached`. Every request is marked `X-Nezha-Prefetch` so the node runs
it behind its live traffic (cachenode/front/pacing.py). No object body crosses
the controller. What the answers mean, a redirect to follow or a refusal, is
read here too.

A mixin of `Prefetcher` (controller/prefetch.py), which gives it `_session`,
`_clock`, `timeout`, `poll`, `_ring`, `_origins`, `_cluster_token`, `fills`,
`_fill_slot`, `_fill_batches` and `_stored_batches`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import structlog
from yarl import URL

from controller.expand import Auth
from controller.prefetch_batches import FillBatches
from nezha.keys import BadTarget, key_for, parse_target
from nezha.wire import (CACHE_HEADER, ORIGIN_ERROR_HEADER, PASSED_ON, PEER_HEADER, PREFETCH_CHECK, PREFETCH_FILL,
                        PREFETCH_HEADER, PREFETCH_PATH, PREFETCH_WAIT, SCHEME_HEADER, STORED_PATH, TOKEN_HEADER)

log = structlog.get_logger("nezha.controller.prefetch")

REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass
class Result:
    url: str
    ok: bool = False
    bytes: int = 0
    reason: str = ""
    key: str | None = None  # the stored object's cache key (a redirect's target's), once stored
    owner: str | None = None  # the node that stores it


@dataclass(frozen=True)
class _Redirect:
    location: str


class StoredBatch:
    """The objects whose fill answered on one node, asked about together (`POST /_nezha/stored`,
    cachenode/front/stored_checks.py): one request for every object pending when the last one came back,
    instead of a `HEAD` each. `ask` gives the stored size, or None when the node has not stored it yet
    (or does not know the endpoint: an older node; then every later object goes the `HEAD` way)."""

    def __init__(self, *, url: str, session, headers: dict[str, str]) -> None:
        self.url = url
        self._session = session
        self._headers = headers
        self._pending: dict[str, tuple[str, asyncio.Future]] = {}
        self.task: asyncio.Task | None = None
        self.unsupported = False
        self.requests = 0

    async def ask(self, key: str, obj: str) -> int | None:
        if self.unsupported:
            return None
        loop = asyncio.get_running_loop()
        if key in self._pending:
            return await asyncio.shield(self._pending[key][1])
        future = loop.create_future()
        self._pending[key] = (obj, future)
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._run())
        return await asyncio.shield(future)

    async def _run(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            answer: dict = {}
            try:
                self.requests += 1
                body = {"objects": [{"key": k, "object": obj} for k, (obj, _) in batch.items()]}
                async with self._session().post(self.url, json=body, headers=self._headers) as r:
                    if r.status in (404, 405):
                        self.unsupported = True
                    elif r.status == 200:
                        answer = await r.json()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                log.debug("prefetch_stored_unasked", node=self.url, error=f"{type(e).__name__}: {e}")
            finally:
                stored = answer.get("stored") if isinstance(answer.get("stored"), dict) else {}
                for key, (_, future) in batch.items():
                    if not future.done():
                        size = stored.get(key)
                        future.set_result(size if isinstance(size, int) and not isinstance(size, bool) else None)


class NodeFills:
    def _key(self, url: str) -> str | None:
        try:
            target = parse_target(url, urlsplit(url).netloc)
        except BadTarget:
            return None
        return key_for(target, self._origins.get(target.host))

    async def _ask(self, url: str, auth: Auth | None = None) -> Result | _Redirect:
        parts = urlsplit(url)
        try:
            target = parse_target(url, parts.netloc)
        except BadTarget as e:
            return Result(url, reason=f"not a URL the cache serves: {e}")
        ring, addresses = self._ring()
        if ring is None or not addresses:
            return Result(url, reason="the cache has no ring yet")
        origin = self._origins.get(target.host)
        key = key_for(target, origin)
        owner = ring.owners(key, 1)[0]
        # As written: requoting (yarl turns %27 into ') would make the node store another key than the
        # one asked of its owner and pinned, and than the one a client that sends the URL as given reads.
        node = URL(f"http://{addresses[owner]}{target.path_qs}", encoded=True)
        credentials = {}
        if auth is not None and origin is not None:
            credentials = auth(url, origin.upstream_for(target.scheme, target.host) + target.path_qs)
        # An authorize origin's object is filled by one whole request, also when its credential is in the
        # URL (a signed CDN URL the Hub redirected to): a Range would be kept as a part, not filled.
        signed = bool(credentials) or (origin is not None and origin.credentials == "authorize")
        headers = {"Host": target.host}
        if target.scheme == "https" or signed:
            # As a peer relays a client of the TLS port: stored under the https key that client reads;
            # the cluster token also lets the probe below read a signed fill's copy from the disk.
            headers.update({PEER_HEADER: "nezha-controller", SCHEME_HEADER: target.scheme})
            if self._cluster_token:
                headers[TOKEN_HEADER] = self._cluster_token
        try:
            if signed:
                async with self._fill_slot():
                    answer = await self._signed_fill(url, node, owner, {**headers, **credentials})
            else:
                answer = await self._batched(url, owner, addresses[owner])
                if answer is None:  # the batch could not say: the ordinary way, a request and its checks
                    async with self._fill_slot():  # the node is told no bound for these: held here
                        answer = await self._fill(url, node, owner, headers, key=key, address=addresses[owner])
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return Result(url, reason=f"{owner} could not be asked: {type(e).__name__}: {e}")
        if isinstance(answer, Result) and answer.ok:
            answer.key, answer.owner = key, owner
        return answer

    async def _batched(self, url: str, owner: str, address: str) -> Result | _Redirect | None:
        """A public object filled in the owner's next batch (controller/prefetch_batches.py); None: the batch
        could not say (an older node, one that went away, an object it hands back as not its to fill so)."""
        batches = self._fill_batches.get(address)
        if batches is None:
            token = {TOKEN_HEADER: self._cluster_token} if self._cluster_token else {}
            batches = self._fill_batches[address] = FillBatches(
                url=f"http://{address}{PREFETCH_PATH}", session=self._session, fills=self.fills,
                headers={PREFETCH_HEADER: PREFETCH_CHECK, **token})
        deadline = self._clock() + self.timeout
        while True:
            line = await batches.ask(url)
            if line is None or "not_here" in line:
                if line is not None:
                    log.debug("prefetch_fill_not_batched", url=url, node=owner, why=line["not_here"])
                return None
            if "stored" in line:
                return Result(url, ok=True, bytes=int(line["stored"]))
            if "location" in line:
                return _Redirect(str(line["location"]))
            if "passed" in line:
                return Result(url, reason=f"{owner} passed it through ({line.get('status')}, pass): "
                                          "the origin's answer may not be stored")
            if "failed" in line:
                return Result(url, reason=f"{owner} answered {line.get('status')}: {line['failed']}")
            if not line.get("wait") or self._clock() >= deadline:
                return None  # waited its longest behind live traffic until our own deadline: the ordinary way

    async def _fill(self, url: str, node: URL, owner: str, headers: dict[str, str], *, key: str,
                    address: str) -> Result | _Redirect:
        """A public object: its first byte asked for (the fill goes on for the whole), then whether it is
        stored: with the other objects that node filled then (`/_nezha/stored`), else HEAD until it is."""
        session = self._session()
        async with await self._start_fill(session, node, {**headers, "Range": "bytes=0-0"}) as r:
            await r.read()
            refused = await self._refused(url, owner, r)
            if refused is not None:
                return refused
        batch = self._stored_batches.get(address)
        if batch is None:
            # Marked as the prefetch's own: unmarked, the node would count it live traffic and run its
            # prefetch fills one at a time (cachenode/front/pacing.py).
            marks = {PREFETCH_HEADER: PREFETCH_CHECK,
                     **({TOKEN_HEADER: self._cluster_token} if self._cluster_token else {})}
            batch = self._stored_batches[address] = StoredBatch(url=f"http://{address}{STORED_PATH}",
                                                                session=self._session, headers=marks)
        size = await batch.ask(key, headers["Host"] + node.raw_path_qs)
        if size is not None:
            return Result(url, ok=True, bytes=size)
        deadline = self._clock() + self.timeout
        for wait in self._waits():
            # The fill commits after its last byte (a rename, off the loop); the node holds a check of a
            # fill it runs until that commit (up to a second: cachenode/front/pacing.py), so the first
            # ask goes at once and is answered as soon as the object is stored.
            await asyncio.sleep(wait)
            # max-stale: a copy stored without a lifetime of its own (no Cache-Control, no
            # Last-Modified) is stale at once, and still stored: revalidated when read.
            async with session.head(node, headers={**headers, "Cache-Control": "only-if-cached, max-stale",
                                                   PREFETCH_HEADER: PREFETCH_CHECK}, allow_redirects=False) as r:
                if r.status == 200:
                    return Result(url, ok=True, bytes=int(r.headers.get("Content-Length") or 0))
            if self._clock() >= deadline:
                break
        return Result(url, reason=f"not stored on {owner} within {self.timeout:g}s")

    async def _signed_fill(self, url: str, node: URL, owner: str, headers: dict[str, str]) -> Result | _Redirect:
        """An object read with credentials (an `authorize` origin's, docs/private-objects.md): its signed
        Range would be kept as a part, not filled whole, so the whole object is asked for and the answer
        let go once its head is in (the fill goes on on its own); then a peer's `only-if-cached` ranged
        GET, which the owner answers from its disk, says when it is stored and how long it is."""
        session = self._session()
        async with await self._start_fill(session, node, headers) as r:
            refused = await self._refused(url, owner, r)
            if refused is not None:
                return refused
            r.close()  # not a byte of the body crosses the controller
        deadline = self._clock() + self.timeout
        probe = {**headers, "Range": "bytes=0-0", "Cache-Control": "only-if-cached, max-stale",
                 PREFETCH_HEADER: PREFETCH_CHECK}
        for wait in self._waits():
            await asyncio.sleep(wait)
            async with session.get(node, headers=probe, allow_redirects=False) as r:
                await r.read()
                if r.status in (200, 206):
                    total = (r.headers.get("Content-Range") or "").rpartition("/")[2]
                    size = int(total) if total.isdigit() else int(r.headers.get("Content-Length") or 0)
                    return Result(url, ok=True, bytes=size)
                if r.status != 504:
                    return await self._refused(url, owner, r) or Result(
                        url, reason=f"{owner} answered {r.status} when asked whether it stored it")
            if self._clock() >= deadline:
                break
        return Result(url, reason=f"not stored on {owner} within {self.timeout:g}s")

    async def _start_fill(self, session: aiohttp.ClientSession, node: URL,
                          headers: dict[str, str]) -> aiohttp.ClientResponse:
        """The request that starts a fill, marked so the node runs it behind its live traffic
        (cachenode/front/pacing.py); asked again while the node answers that it waited its longest."""
        deadline = self._clock() + self.timeout
        while True:
            r = await session.get(node, headers={**headers, PREFETCH_HEADER: PREFETCH_FILL}, allow_redirects=False)
            if r.status != 503 or r.headers.get(PREFETCH_HEADER) != PREFETCH_WAIT or self._clock() >= deadline:
                return r
            r.release()
            log.debug("prefetch_fill_waits", url=str(node))

    def _waits(self):
        """Pauses before each ask whether an object is stored: none before the first (the node holds it
        until the fill it runs is stored, or a second), then 5 ms, doubling up to `poll`. A small object
        is stored within milliseconds of its first byte, a large one takes seconds: asking soon keeps a
        large expansion of small objects from waiting `poll` on each."""
        yield 0.0
        wait = min(0.005, self.poll)
        while True:
            yield wait
            wait = min(wait * 2, self.poll)

    async def _refused(self, url: str, owner: str, r: aiohttp.ClientResponse) -> Result | _Redirect | None:
        """What an answer to a fill says instead of "filling": a redirect to follow, or why it fails."""
        if r.status in REDIRECTS and r.headers.get("Location"):
            return _Redirect(r.headers["Location"])
        if r.headers.get(CACHE_HEADER) in PASSED_ON:
            return Result(url, reason=f"{owner} passed it through ({r.status}, {r.headers.get(CACHE_HEADER)}): "
                                      "the origin's answer may not be stored")
        if r.status >= 400:
            reason = r.headers.get(ORIGIN_ERROR_HEADER) or (await r.text())[:200].strip() or r.reason
            return Result(url, reason=f"{owner} answered {r.status}: {reason}")
        return None
