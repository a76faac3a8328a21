"""Events for the hand-offs of nodes a scale-down removes.

The node does the work: out of the ring when SIGTERM comes, it hands its
objects off before it exits (cachenode/node.py `leave`) and records how
that ended in Redis (`nezha:drain:<node-id>`, nezha/index/stats_writer.py), since
nobody can ask it once it has exited. The controller tells the operator:
a Normal Event `DrainStarted` when the pod leaves the ring because replicas
dropped, and once the pod is gone, `DrainFinished` with what was copied, or
a Warning `DrainFailed` naming the objects that did not reach their owners,
or saying the node went without recording a hand-off.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import structlog

from nezha.index.connection import IndexUnavailable
from nezha.wire import DrainOutcome

if TYPE_CHECKING:
    from controller.events import EventRecorder

log = structlog.get_logger("nezha.controller.drains")


@dataclass
class Drain:
    node: str
    started: float  # wall clock, to tell this drain's record from an older one
    task: asyncio.Task | None = None


class Drains:
    def __init__(self, *, events: "EventRecorder", index, present: Callable[[str], bool],
                 poll: float = 0.25, record_wait: float = 5.0) -> None:
        """`present(node)`: whether the node's pod still exists."""
        self.events = events
        self.index = index
        self._present = present
        self.poll = poll
        self.record_wait = record_wait
        self.running: dict[str, Drain] = {}

    def observe(self, *, sts: dict, leaving: list[str]) -> None:
        """`leaving`: nodes out of the ring for a scale-down whose pods are still there."""
        for node in leaving:
            if node not in self.running:
                drain = self.running[node] = Drain(node, started=time.time())
                drain.task = asyncio.get_running_loop().create_task(self._follow(sts, drain))
        for node in list(self.running):
            if not self._present(node) and self.running[node].task is None:
                del self.running[node]  # followed to its end and gone: a later pod of that name is new

    async def close(self) -> None:
        """Stop following (leadership lost, or shutdown); a new leader starts over."""
        tasks = [d.task for d in self.running.values() if d.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.running.clear()

    async def _follow(self, sts: dict, drain: Drain) -> None:
        replicas = (sts.get("spec") or {}).get("replicas")
        await self.events.emit(sts, "Normal", "DrainStarted",
                               f"{drain.node} left the ring (replicas {replicas}): it hands its objects to their "
                               "new owners before it exits")
        while self._present(drain.node):
            await asyncio.sleep(self.poll)
        record = None
        for _ in range(int(self.record_wait / self.poll) + 1):  # the record lands just before the exit
            try:
                record = await self.index.read_drain(drain.node)
            except IndexUnavailable as e:
                log.warning("drain_record_unreadable", node=drain.node, error=str(e))
            if record is not None and float(record.get("started", 0)) >= drain.started - 60:
                break
            record = None
            await asyncio.sleep(self.poll)
        await self._report(sts, drain.node, record)
        drain.task = None

    async def _report(self, sts: dict, node: str, p: dict | None) -> None:
        if p is None:
            await self.events.emit(sts, "Warning", "DrainFailed",
                                   f"{node} went without recording a hand-off (killed before it could, or it had no "
                                   "index): what it held will be fetched from the origin again")
        elif p.get("outcome") == DrainOutcome.HANDED_OFF:
            await self.events.emit(sts, "Normal", "DrainFinished",
                                   f"{node} handed off {p.get('total', 0)} objects: {p.get('copied', 0)} copied, "
                                   f"{p.get('present', 0)} already there, {p.get('skipped', 0)} stale and left to "
                                   f"revalidate, {p.get('bytes', 0)} bytes")
        else:
            errors = "; ".join(p.get("errors") or [])[:600]
            await self.events.emit(sts, "Warning", "DrainFailed",
                                   f"{node}: hand-off {p.get('outcome')}: {p.get('done', 0)} of {p.get('total', 0)} "
                                   f"objects done, {p.get('failed', 0)} copies failed; those will be fetched from "
                                   f"the origin again" + (f": {errors}" if errors else ""))
        log.info("drain_reported", node=node, outcome=p.get("outcome") if p else None)
