"""Prefetch fills run at a lower priority than live requests.

The controller fills a workload's prefetch through the ordinary request path
(controller/prefetch.py), its requests marked `X-Nezha-Prefetch: fill` (fill
this object) and `check` (is it stored yet?). A node is one event loop: a
fixed number of fills in flight from the controller took most of it from
the live hits beside them (bench/prefetch.py, docs/benchmarks.md "Prefetch
by manifest"), so the node itself decides how many prefetch fills it runs:
at most `busy` while it serves live requests (one in flight, or one seen
within the last `quiet` seconds), at most `idle` otherwise. A fill beyond
that waits here, before anything of it is done, in a queue no longer than
the controller's window of asks (twice its `--prefetch-fills`).

A fill's slot is held from its `fill` request until a `check` of the same
object answers that it is stored (a fill runs on after the first byte its
request is answered with), or HOLD seconds at most, so a controller that
never asks again cannot keep the node's prefetch shut. A fill that waited
WAIT seconds is answered 503 with `X-Nezha-Prefetch: wait`, and the
controller asks again: no request waits longer than a client's read timeout.

A `check` of an object whose fill holds a slot here waits on the node for
it to be stored, up to CHECK_WAIT, looking again 1 ms later, then 2, up to
CHECK_STEP apart: the controller learns the object is stored within a
few milliseconds of its commit instead of at its own next ask (a network
round trip and a pause each), which cost a prefetch of small objects a
quarter of its rate (docs/benchmarks.md, "Prefetch by manifest").

The controller's batches of fills (`/_nezha/prefetch`, front/prefetch_fills.py)
are no live traffic either: each of their objects takes a slot here as a
`fill` does, and gives it back once stored. A batch also says how many of
the controller's fills may run at once (`fills`, its `--prefetch-fills`):
the controller names more objects than that to a node ahead of time, and
they wait here for a slot, so the next fill starts the moment one is
stored instead of a round trip to the controller later (the `cap` of
`admits`, under the node's own bounds).

`admits` is the decision, pure; `Pacing` keeps the counts and the queue;
`paced` is the middleware that marks every other request live. The fast
path's hits never reach aiohttp: `Counts.plain_hit` marks them in a `LiveHits`
(cachenode/counts.py) that `Pacing` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Callable

from aiohttp import web

from cachenode.counts import LiveHits
from nezha.wire import PREFETCH_CHECK, PREFETCH_HEADER, PREFETCH_PATH, PREFETCH_WAIT

HOLD = 60.0  # seconds a fill's slot is held at most without a check saying it is stored
WAIT = 20.0  # seconds a fill waits here at most (the controller reads for 60 s before it gives up)
CHECK_WAIT = 1.0  # seconds a check of a running fill waits here for it to be stored before "not yet" (504)
CHECK_STEP = 0.02  # seconds between two looks, at most, while a check waits
STARTED = frozenset({200, 206})  # a fill's answer when it is stored or under way; a check's when stored


def admits(*, running: int, live_in_flight: int, since_live: float, busy: int, idle: int, quiet: float,
           cap: int | None = None) -> bool:
    """Whether one more prefetch fill may start now, with `running` under way: live traffic is a live
    request in flight or one that ended less than `quiet` seconds ago. `cap`: the controller's own bound
    (its `--prefetch-fills`, sent with a batch), under the node's."""
    live = live_in_flight > 0 or since_live < quiet
    bound = busy if live else idle
    return running < (bound if cap is None else min(bound, cap))


class Pacing:
    """One node's prefetch fills (with --workers, the primary's: followers hand it every request that is not
    a plain hit, and count their hits with it): those running, by object, and those waiting."""

    def __init__(self, *, busy: int, idle: int, quiet: float, wait: float = WAIT, check_wait: float = CHECK_WAIT,
                 clock: Callable[[], float] = time.monotonic, hits: LiveHits | None = None) -> None:
        """`hits`: when the fast path last answered a hit, on the same `clock`."""
        self.busy, self.idle, self.quiet, self.wait, self.check_wait = busy, idle, quiet, wait, check_wait
        self._clock = clock
        self.live_in_flight = 0
        self._last_live = float("-inf")  # when a live request through the middleware last began or ended
        self.hits = hits or LiveHits(clock=clock)
        self._held: dict[str, float] = {}  # object (Host + path) -> when its slot is given back at the latest
        self._turns: deque[asyncio.Future] = deque()  # the fills waiting for a slot, in the order they came
        self.waiting = 0
        self.started = 0  # fills let through, ever (tests, logs)
        self.started_while_live = 0
        self.told_to_wait = 0  # fills answered 503 after waiting `wait`

    @property
    def running(self) -> int:
        return len(self._held)

    def live_began(self) -> None:
        self.live_in_flight += 1
        self._last_live = self._clock()

    def live_ended(self) -> None:
        self.live_in_flight -= 1
        self._last_live = self._clock()

    def is_live(self) -> bool:
        return self.live_in_flight > 0 or self._clock() - self._latest_live() < self.quiet

    def _latest_live(self) -> float:
        return max(self._last_live, self.hits.last)

    async def fill(self, obj: str, cap: int | None = None) -> None:
        """Wait until a fill of `obj` may start, then hold its slot (until `stored(obj)` or HOLD); `cap`: at
        most that many prefetch fills running here, whatever the node's own bound allows."""
        while True:
            now = self._clock()
            self._expire(now)
            if obj in self._held or admits(running=self.running, live_in_flight=self.live_in_flight,
                                           since_live=now - self._latest_live(), busy=self.busy, idle=self.idle,
                                           quiet=self.quiet, cap=cap):
                break
            # Woken alone when a slot is given back (`_wake`): all of them woken at once, the many waiting
            # behind live traffic looked, and all but one went back to wait, for every fill let through.
            turn = asyncio.get_running_loop().create_future()
            self._turns.append(turn)
            # Nothing tells the end of live traffic: it is a quiet `quiet` long, looked at again after it.
            timeout = min([self.quiet] + [at - now for at in self._held.values()])
            self.waiting += 1
            try:
                # The turn awaited itself, not through asyncio.wait: a slot given back starts the next
                # fill one step of the loop later, not three (with 16 fills of 20 ms, the steps kept
                # one slot in six empty).
                async with asyncio.timeout(max(timeout, 0.001)):
                    await turn
            except TimeoutError:
                pass  # look again
            except BaseException:
                if turn.done() and not turn.cancelled():
                    self._wake()  # given the turn, and gone (its request timed out): the next one takes it
                raise
            finally:
                self.waiting -= 1
                if turn.cancelled() or not turn.done():
                    turn.cancel()
                    with contextlib.suppress(ValueError):
                        self._turns.remove(turn)
        self.started += 1
        if self.is_live():
            self.started_while_live += 1
        self._held[obj] = self._clock() + HOLD

    def filling(self, obj: str) -> bool:
        """Whether a fill of `obj` holds a slot here (let through, not yet known stored)."""
        return obj in self._held

    def stored(self, obj: str) -> None:
        """`obj`'s fill is over (stored, or its request failed): its slot goes to the next in the queue."""
        if self._held.pop(obj, None) is not None:
            self._wake()

    def _expire(self, now: float) -> None:
        for obj in [o for o, at in self._held.items() if at <= now]:
            del self._held[obj]

    def _wake(self) -> None:
        """The longest waiting fill looks again: one slot was given back."""
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_result(None)
                return


def paced(pacing: Pacing):
    """The middleware: a prefetch `fill` waits for its slot and keeps it while the fill runs on; a `check`
    that finds the object stored gives it back; every other request is live traffic."""

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        if request.raw_path == PREFETCH_PATH:
            return await handler(request)  # the controller's batch of fills: each waits for a slot itself
        mark = request.headers.get(PREFETCH_HEADER)
        if mark is None:
            pacing.live_began()
            try:
                return await handler(request)
            finally:
                pacing.live_ended()
        obj = request.headers.get("Host", "") + request.raw_path
        if mark.strip().lower() == PREFETCH_CHECK:
            resp = await _check(request, handler, pacing, obj)
            if resp.status in STARTED:
                pacing.stored(obj)
            return resp
        try:  # any other mark is a fill: the wait is the safe reading
            await asyncio.wait_for(pacing.fill(obj), timeout=pacing.wait)
        except asyncio.TimeoutError:
            pacing.told_to_wait += 1
            return web.Response(status=503, headers={PREFETCH_HEADER: PREFETCH_WAIT, "Retry-After": "1"},
                                text=f"prefetch fills wait behind live requests here; {pacing.waiting} waiting, "
                                     f"{pacing.running} running: ask again\n")
        try:
            resp = await handler(request)
        except BaseException:
            pacing.stored(obj)
            raise
        if resp.status not in STARTED:
            pacing.stored(obj)  # refused, redirected, failed: no fill runs on
        return resp

    return middleware


async def _check(request: web.Request, handler, pacing: Pacing, obj: str) -> web.StreamResponse:
    """Answer a `check`; while it is "not cached" (504) and `obj`'s fill still runs here, look again, up to
    `pacing.check_wait`. The looks are the node's own (an index lookup each), not the controller's requests."""
    deadline = time.monotonic() + pacing.check_wait
    step = 0.001
    while True:
        try:
            return await handler(request)
        except web.HTTPGatewayTimeout:
            if not pacing.filling(obj) or time.monotonic() + step > deadline:
                raise
        await asyncio.sleep(step)
        step = min(step * 2, CHECK_STEP)
