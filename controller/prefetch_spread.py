"""Where the pods land: `nezha.io/prefetch-spread: all` copies a workload's objects to every node.

Every replica of an inference Deployment reads every file of its model.
Once a workload's objects are stored and pinned, each one up to
`spread_max` is copied from its owner to every other node as a hot copy
(`POST /_nezha/replicate` with `"hot": true`, the cluster token); larger
ones stay with their owners. The copies share the `fills` slots. The
workload's pods wait for it at their scheduling gate (webhook/gate.py,
controller/gates.py), so their first reads are answered by the node they
reach, from its own disk.

A mixin of `Prefetcher` (controller/prefetch.py), which gives it `_ring`,
`_session`, `_cluster_token`, `_slots`, `_waiting_for`, `fills`, `jobs`,
`events` and `spread_max`.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import aiohttp
import structlog

from controller.annotations import PREFETCH_SPREAD
from controller.gates import DONE, SPREADING, UNFOLLOWED
from nezha.keys import target_of
from nezha.wire import FAILED_PREFIX, REPLICATE_PATH, TOKEN_HEADER

if TYPE_CHECKING:
    from controller.prefetch import JobProgress

log = structlog.get_logger("nezha.controller.prefetch")


class Spreading:
    def spread_state(self, key: str) -> str:
        """How far the spread of workload `key` ("Kind/ns/name", one that asks for it) is: DONE, or
        SPREADING (under way, or not yet followed); UNFOLLOWED when its prefetch asks for no spread."""
        progress = self.jobs.get(key)
        if progress is None:
            return SPREADING  # the next pass follows it
        if not progress.spread:
            return UNFOLLOWED
        return DONE if progress.spread_done is not None else SPREADING

    async def _spread(self, key: str, job: dict, progress: "JobProgress") -> None:
        """Copy each stored object up to `spread_max` from its owner to every other node, as a hot copy
        (`/_nezha/replicate` with `hot`), so each replica of a model reads every file from its own node."""
        _, addresses = self._ring()
        stored = [r for r in progress.results.values() if r.ok and r.key and r.owner and r.bytes <= self.spread_max]
        copies = failed = 0
        reasons: list[str] = []
        for result in stored:
            target = target_of(result.key)
            body = {"host": target.host, "path": target.path_qs, "scheme": target.scheme, "source": result.owner,
                    "address": addresses.get(result.owner), "hot": True}
            for node, address in sorted(addresses.items()):
                if node == result.owner:
                    continue
                why = await self._copy_to(address, body)
                if why is None:
                    copies += 1
                else:
                    failed += 1
                    reasons.append(f"{result.url} to {node}: {why}")
        progress.spread_done = {"objects": len(stored), "copies": copies, "failed": failed,
                                "larger_than_max": sum(1 for r in progress.results.values()
                                                       if r.ok and r.bytes > self.spread_max)}
        log.info("prefetch_spread", job=key, **progress.spread_done)
        if failed:
            await self.events.emit(job, "Warning", "PrefetchNotSpread", (
                f"{PREFETCH_SPREAD}: {failed} of {copies + failed} copies were not made (a node's hot share, "
                f"--hot-share, bounds them); first: {reasons[0]}"))

    async def _copy_to(self, address: str, body: dict) -> str | None:
        """Ask the node at `address` to copy one object as a hot copy; None once it holds it, else why not."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, self.fills))
        headers = {TOKEN_HEADER: self._cluster_token} if self._cluster_token else {}
        async with self._waiting_for(self._slots):
            try:
                async with self._session().post(f"http://{address}{REPLICATE_PATH}", json=body,
                                                headers=headers) as r:
                    if r.status != 200:
                        return f"{r.status} {(await r.text())[:200].strip()}"
                    last: dict = {}
                    async for line in r.content:  # one JSON object a line; the last says how it ended
                        if line.strip():
                            last = json.loads(line)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                return f"{type(e).__name__}: {e}"
        result = str(last.get("result", "no result"))
        return result.removeprefix(FAILED_PREFIX) if result.startswith(FAILED_PREFIX) or "result" not in last \
            else None
