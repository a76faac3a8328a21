"""What the controller pinned for each workload (`nezha:pins`), for `nezha stats`.

The pins themselves live on the nodes that store the objects
(cachenode/store/pins.py); this is their account, written by the leading
controller when it pins a workload's objects and when it releases them,
one hash field per workload:

    HSET nezha:pins "Job/ml/train" '{"bytes": 1280000000, "until": null}'

`until` is null while the workload exists, then the unix time its pins
end. A field past its `until` is removed by the next write and left out by
every read. Like every other write of the controller, one that Redis does
not answer is logged and dropped: a prefetch never waits on Redis.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from nezha.index.connection import REDIS_ERRORS, Connection, text
from nezha.index.schema import KEY_PINS


class PinRecords:
    def __init__(self, conn: Connection, *, clock: Callable[[], float] = time.time) -> None:
        self.conn = conn
        self._clock = clock

    async def record_pins(self, workload: str, pinned: int, until: float | None) -> None:
        """`workload` has `pinned` bytes pinned, until `until` (None: while it exists)."""
        if not self.conn.enabled:
            return
        try:
            client = self.conn.client
            await client.hset(KEY_PINS, workload, json.dumps({"bytes": pinned, "until": until}))
            expired = [name for name, record in (await self._read_raw()).items()
                       if record["until"] is not None and record["until"] <= self._clock()]
            if expired:
                await client.hdel(KEY_PINS, *expired)
        except REDIS_ERRORS as e:
            self.conn.unavailable("record pins in", e)

    async def read_pins(self) -> dict[str, dict]:
        """workload -> {"bytes", "until"}, for the pins that hold now."""
        if not self.conn.enabled:
            return {}
        try:
            records = await self._read_raw()
        except REDIS_ERRORS as e:
            self.conn.unavailable("read pins from", e)
        now = self._clock()
        return {w: r for w, r in records.items() if r["until"] is None or r["until"] > now}

    async def _read_raw(self) -> dict[str, dict]:
        out = {}
        for name, raw in (await self.conn.client.hgetall(KEY_PINS)).items():
            try:
                record = json.loads(text(raw))
                out[text(name)] = {"bytes": int(record["bytes"]), "until": record.get("until")}
            except (ValueError, KeyError, TypeError):
                continue  # not ours to read: a hand edit; the next write of that workload replaces it
        return out
