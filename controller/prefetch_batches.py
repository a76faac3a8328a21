"""The public objects the controller has one node fill, sent to it together (`POST /_nezha/prefetch`).

A prefetch of many small objects cost the controller two requests an
object (the fill's ranged GET, a share of a `/_nezha/stored` batch) and
the node as much work again as a client's read of it. Now every public
object whose first owner is one node goes into that node's next batch:
what the workers ask for in one turn of the event loop goes in one
request, sent at the end of that turn, and the node answers a line per
object once it is stored, or why not
(cachenode/front/pacing.py paces the fills; cachenode/front/prefetch_fills.py
runs them). No "stored yet?" follows, and nothing waits for a batch in
flight to end: with 16 fills, lines come back a few at a time, and the
objects the workers take up next go at once, a few to a request (about
4 in bench/prefetch.py's runs). A cap on the batches in flight would make
the objects behind it wait for a whole batch to end, its slowest object
included; they are bounded all the same, each holding at least one of the
objects the controller asks at once. Each batch says how many of the
controller's fills may run on the node at once (`fills`): the controller
names twice that many, and the node holds the rest until a slot is free
(cachenode/front/pacing.py), so a line coming back is never what the next
fill waits for.

`ask` gives the node's line for a URL, or None when the batch could not
say (a node without the endpoint, one that went away, an object it hands
back as `not_here`): the caller then fills it the ordinary way, one
request and its checks (controller/prefetch_fills.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable

import aiohttp
import structlog

log = structlog.get_logger("nezha.controller.prefetch")


class FillBatches:
    def __init__(self, *, url: str, session: Callable[[], aiohttp.ClientSession], headers: dict[str, str],
                 fills: int | None = None) -> None:
        """`fills`: how many of the controller's fills may run on the node at once, sent with each batch;
        the node holds the rest of what it was named until a slot is free."""
        self.url = url
        self.fills = fills
        self._session = session
        self._headers = headers
        self._pending: dict[str, asyncio.Future] = {}
        self._sending: set[asyncio.Task] = set()
        self._scheduled = False
        self.unsupported = False  # the node does not know the endpoint (an older node): ask the ordinary way
        self.requests = 0  # batches sent (tests, logs)
        self.objects = 0  # URLs sent in them

    async def ask(self, url: str) -> dict | None:
        """The node's line for `url` (`stored`, `location`, `failed`, `passed`, `wait`), or None."""
        if self.unsupported:
            return None
        future = self._pending.get(url)
        if future is None:
            future = self._pending[url] = asyncio.get_running_loop().create_future()
            self._schedule()
        return await asyncio.shield(future)

    def _schedule(self) -> None:
        """Send what is pending once this turn of the loop is over: every worker a line released meanwhile
        has asked by then, so they go in one batch instead of one each."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send_pending)

    def _send_pending(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        self._sending.discard(task)

    async def _send(self, batch: dict[str, asyncio.Future]) -> None:
        self.requests += 1
        self.objects += len(batch)
        try:
            body = {"urls": list(batch), **({"fills": self.fills} if self.fills is not None else {})}
            async with self._session().post(self.url, json=body, headers=self._headers) as r:
                if r.status in (404, 405):
                    self.unsupported = True
                elif r.status != 200:
                    log.warning("prefetch_batch_refused", node=self.url, status=r.status,
                                error=(await r.text())[:200].strip())
                else:
                    async for line in r.content:
                        self._answered(batch, line)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            log.info("prefetch_batch_broken", node=self.url, objects=len(batch), error=f"{type(e).__name__}: {e}")
        finally:
            for future in batch.values():
                if not future.done():
                    future.set_result(None)

    @staticmethod
    def _answered(batch: dict[str, asyncio.Future], line: bytes) -> None:
        if not line.strip():
            return  # the node is still working
        answer = json.loads(line)
        future = batch.get(answer.get("url")) if isinstance(answer, dict) else None
        if future is not None and not future.done():
            future.set_result(answer)

    def cancel(self) -> list[asyncio.Task]:
        """Stop every batch in flight (leadership lost, or shutdown): the tasks, to wait for."""
        for task in self._sending:
            task.cancel()
        return list(self._sending)
