"""Reads of what the nodes wrote: statistics, object locations, hand-off records.

For operators (`nezha stats`), the controller (scaling, drain Events) and
nodes asking where an object is. A read that cannot be answered raises
IndexUnavailable naming what was read and from where; a disabled index has
no shared stats at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from nezha.index.connection import REDIS_ERRORS, Connection, IndexUnavailable, number, text
from nezha.index.schema import (FIELDS, KEY_CLUSTER_STATS, holders, key_drain, key_host_stats,
                                key_node_stats, key_object)


class StatsReader:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def locations(self, key: str) -> set[str]:
        """Node ids that hold `key` according to Redis (updates not yet flushed are not included)."""
        if not self.conn.enabled:
            return set()
        try:
            return holders(await self.conn.client.hkeys(key_object(key)))
        except REDIS_ERRORS as e:
            self.conn.unavailable(f"read locations of {key} from", e)

    async def object_info(self, key: str) -> dict | None:
        """{"host", "size", "stored_at", "last_access", "nodes"} of `key`, or None if no node holds it."""
        if not self.conn.enabled:
            return None
        try:
            raw = await self.conn.client.hgetall(key_object(key))
        except REDIS_ERRORS as e:
            self.conn.unavailable(f"read object {key} from", e)
        meta = {text(k): text(v) for k, v in raw.items()}
        nodes = holders(meta)
        if not nodes:
            return None
        last_access = meta.get("last_access")
        return {
            "host": meta.get("host") or urlsplit(key).hostname,  # a record written before issue 35 has its own
            "size": int(meta["size"]) if "size" in meta else None,
            "stored_at": float(meta["stored_at"]) if "stored_at" in meta else None,
            "last_access": float(last_access) if last_access is not None else None,
            "nodes": nodes,
        }

    async def read_cluster_stats(self) -> dict[str, int]:
        """`nezha:stats:cluster` alone (every FIELD an int, 0 if absent): one read, no scan."""
        try:
            raw = await self.conn.client.hgetall(KEY_CLUSTER_STATS)
        except REDIS_ERRORS as e:
            self.conn.unavailable("read stats from", e)
        values = {text(k): number(v) for k, v in raw.items()}
        return {f: int(values.get(f, 0)) for f in FIELDS}

    async def read_drain(self, node_id: str) -> dict | None:
        """A node's last recorded hand-off (StatsWriter.record_drain), or None."""
        try:
            raw = await self.conn.client.hgetall(key_drain(node_id))
        except REDIS_ERRORS as e:
            self.conn.unavailable(f"read {key_drain(node_id)} from", e)
        if not raw:
            return None
        out: dict[str, Any] = {}
        for k, v in raw.items():
            k, v = text(k), text(v)
            try:
                out[k] = json.loads(v) if k == "errors" else number(v)
            except ValueError:
                out[k] = v
        return out

    async def read_node_counters(self, node_ids: list[str], field: str = "bytes_served") -> dict[str, int]:
        """One counter of `nezha:stats:node:<id>` for each of `node_ids` that has it (one round trip)."""
        if field not in FIELDS:
            raise ValueError(f"unknown stats field {field!r}")
        pipe = self.conn.client.pipeline(transaction=False)
        for node in node_ids:
            pipe.hget(key_node_stats(node), field)
        try:
            values = await pipe.execute()
        except REDIS_ERRORS as e:
            self.conn.unavailable("read stats from", e)
        out = {}
        for node, value in zip(node_ids, values):
            if value is not None:
                try:
                    out[node] = int(text(value))
                except ValueError:
                    continue
        return out

    async def read_stats(self) -> dict:
        """{"cluster": {...}, "nodes": {id: {...}}, "hosts": {host: {...}}}, every FIELD an int (0 if absent)."""
        if not self.conn.enabled:
            raise IndexUnavailable("the index is disabled (no redis_url): there are no shared stats")
        client = self.conn.client
        try:
            names: list[str] = []
            for pattern in (key_node_stats("*"), key_host_stats("*")):
                async for name in client.scan_iter(match=pattern, count=500):
                    names.append(text(name))
            names = sorted(set(names))
            pipe = client.pipeline(transaction=False)
            pipe.hgetall(KEY_CLUSTER_STATS)
            for name in names:
                pipe.hgetall(name)
            cluster, *hashes = await pipe.execute()
        except REDIS_ERRORS as e:
            self.conn.unavailable("read stats from", e)

        def parse(raw: Mapping) -> dict:
            values = {text(k): number(v) for k, v in raw.items()}
            return {**{f: int(values.get(f, 0)) for f in FIELDS},
                    **{k: v for k, v in values.items() if k not in FIELDS}}

        out: dict = {"cluster": parse(cluster), "nodes": {}, "hosts": {}}
        for name, raw in zip(names, hashes):
            if name.startswith(key_node_stats("")):
                out["nodes"][name[len(key_node_stats("")):]] = parse(raw)
            else:
                out["hosts"][name[len(key_host_stats("")):]] = parse(raw)
        return out
