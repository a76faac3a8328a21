"""Kept while used: what a workload's prefetch stored is pinned on the nodes that store it.

Once a workload's objects are stored, each node that stores some is asked
to keep them from eviction for that workload (`POST /_nezha/pins`,
cachenode/store/pins.py), within its pinned share; what the share has no
room for gets a Warning Event saying how much would have fit. When the
workload is gone (or asks for something else), every node is told its pins
end `nezha.io/prefetch-keep` seconds later. `nezha stats` reads the account
kept in Redis (nezha/index/pins.py).

A mixin of `Prefetcher` (controller/prefetch.py), which gives it `events`,
`_ring`, `_session`, `_cluster_token`, `_record_pins` and `_pinned`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp
import structlog

from controller.annotations import PREFETCH
from nezha.wire import PINS_PATH, TOKEN_HEADER

if TYPE_CHECKING:
    from controller.prefetch import JobProgress

log = structlog.get_logger("nezha.controller.prefetch")


class Pinning:
    async def _pin(self, key: str, job: dict, progress: "JobProgress") -> None:
        """Pin what the workload's prefetch stored on the nodes that store it; a Warning for what the
        pinned share of those nodes had no room for, saying how much would have fit."""
        owned: dict[str, list[str]] = {}
        for result in progress.results.values():
            if result.ok and result.key and result.owner:
                owned.setdefault(result.owner, []).append(result.key)
        if not owned or not self.events.allowed():
            return
        _, addresses = self._ring()
        pinned = refused = room = 0
        unasked: list[str] = []
        for owner, keys in sorted(owned.items()):
            answer = await self._ask_pins(addresses.get(owner), {"workload": key, "pin": keys})
            if answer is None:
                unasked.append(owner)
                continue
            pinned += answer.get("pinned_bytes", 0)
            refused += answer.get("refused_bytes", 0)
            room += answer.get("room") or 0
        progress.pinned = pinned
        self._pinned[key] = pinned
        log.info("prefetch_pinned", job=key, bytes=pinned, refused_bytes=refused, nodes_unasked=unasked)
        await self._account(key, pinned, None)
        if refused:
            await self.events.emit(job, "Warning", "PrefetchNotPinned", (
                f"{PREFETCH}: {pinned} bytes are kept from eviction while this workload exists, {refused} more "
                f"are not: the pinned share (--pinned-share) of the nodes that store them is full; "
                f"{pinned + room} bytes would have fit"))
        if unasked:
            await self.events.emit(job, "Warning", "PrefetchNotPinned",
                                   f"{PREFETCH}: {', '.join(unasked)} could not be asked to keep what it stores")

    async def _release(self, key: str, keep: float) -> None:
        """Tell every node that `key`'s pins end in `keep` seconds (it is gone, or asks for something else)."""
        if not self.events.allowed():
            return
        _, addresses = self._ring()
        for owner, address in sorted(addresses.items()):
            if await self._ask_pins(address, {"workload": key, "release": keep}) is None:
                log.warning("prefetch_pins_not_released", job=key, node=owner)
        log.info("prefetch_pins_released", job=key, keep=keep, nodes=len(addresses))
        pinned = self._pinned.pop(key, None)
        if pinned is not None:
            await self._account(key, pinned, time.time() + keep)

    async def _account(self, key: str, pinned: int, until: float | None) -> None:
        if self._record_pins is None:
            return
        try:
            await self._record_pins(key, pinned, until)
        except Exception as e:  # noqa: BLE001 - Redis away: the pins hold on the nodes all the same
            log.warning("prefetch_pins_not_recorded", job=key, error=f"{type(e).__name__}: {str(e)[:200]}")

    async def _ask_pins(self, address: str | None, body: dict) -> dict | None:
        if address is None:
            return None
        headers = {TOKEN_HEADER: self._cluster_token} if self._cluster_token else {}
        try:
            async with self._session().post(f"http://{address}{PINS_PATH}", json=body, headers=headers) as r:
                if r.status != 200:
                    log.warning("prefetch_pins_refused", node=address, status=r.status,
                                error=(await r.text())[:200].strip())
                    return None
                return await r.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            log.warning("prefetch_pins_unreachable", node=address, error=f"{type(e).__name__}: {e}")
            return None
