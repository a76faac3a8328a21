"""The index through a Redis failover (issue 25): a real master, a replica
and three Sentinels, the master killed while nodes report and the controller
writes the ring. After the promotion every writer is on the new master
without a restart, the controller's ring write is still fenced, and
`nezha stats` reads on; nothing is lost but what the dead master had not
replicated."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as aredis

from nezha.index.handle import Index
from nezha.index.membership import Deposed, Fence
from testkit.redis_server import RedisSentinel, RedisServer
from testkit.tools import require_tool
from testkit.waits import wait_for

HOST = "data.example.test"
NAME = "nezha-index"
PASSWORD = "f4ilover-pw"
ROOT = Path(__file__).resolve().parents[2]


async def _ask(port: int, *command: str):
    client = aredis.Redis(host="127.0.0.1", port=port, decode_responses=True)
    try:
        return await client.execute_command(*command)
    except (OSError, aredis.RedisError):
        return None
    finally:
        await client.aclose()


@pytest.fixture
def sentinel_managed(tmp_path):
    """A master with one replica, watched by three Sentinels (quorum 2)."""
    exe = require_tool("redis-server")
    for name in ("master", "replica", "s0", "s1", "s2"):
        (tmp_path / name).mkdir()
    master = RedisServer(exe, tmp_path / "master", password=PASSWORD)
    replica = RedisServer(exe, tmp_path / "replica", password=PASSWORD, replica_of=master)
    sentinels = [RedisSentinel(exe, tmp_path / f"s{i}", master=master, name=NAME, quorum=2,
                               down_after_ms=1000, failover_timeout_ms=5000) for i in range(3)]
    started = []
    try:
        for server in (master, replica, *sentinels):
            server.start()
            started.append(server)
        yield master, replica, sentinels
    finally:
        for server in started:
            server.stop(kill=True)


async def test_after_the_master_dies_nodes_report_the_fenced_ring_write_lands_and_stats_read_on(
        sentinel_managed):
    master, replica, sentinels = sentinel_managed
    sentinel_ports = [s.port for s in sentinels]

    async def ready() -> bool:
        # Every Sentinel knows the replica and the two others: a failover needs both.
        for port in sentinel_ports:
            replicas = await _ask(port, "SENTINEL", "replicas", NAME)
            others = await _ask(port, "SENTINEL", "sentinels", NAME)
            if not replicas or others is None or len(others) < 2:
                return False
        return True

    await wait_for(ready, timeout=30)
    synced = aredis.from_url(replica.url, decode_responses=True)
    await wait_for(lambda: _linked(synced), timeout=30)
    await synced.aclose()
    url = (f"redis+sentinel://:{PASSWORD}@" + ",".join(f"127.0.0.1:{p}" for p in sentinel_ports) + f"/{NAME}/0")

    nodes = [Index(redis_url=url, node_id=f"nezha-cache-{i}", flush_interval=0.1, backoff_max=0.2,
                   refresh_interval=0.5) for i in range(2)]
    controller = Index(redis_url=url, node_id=None, backoff_max=0.2)
    fence = Fence(generation=3, holder="nezha-controller-abc")
    counted = 0
    stop = asyncio.Event()

    async def report() -> None:
        nonlocal counted
        while not stop.is_set():
            for node in nodes:
                node.count(HOST, hits=1, bytes_served=10)
                counted += 1
            await asyncio.sleep(0.01)

    try:
        for node in nodes:
            await node.start()
        assert await controller.claim_fence(fence) is None
        first = await controller.set_membership({"nezha-cache-0": "127.0.0.11:8080"}, fence=fence)
        reporting = asyncio.create_task(report())
        await wait_for(lambda: all(n.membership is not None and n.membership.epoch == first for n in nodes),
                       timeout=5)
        old = aredis.from_url(master.url, decode_responses=True)
        await wait_for(lambda: old.hget("nezha:stats:cluster", "hits"), timeout=5)
        assert await old.execute_command("WAIT", 1, 2000) == 1  # the ring and the fence are on the replica
        await old.aclose()

        master.stop(kill=True)  # SIGKILL: no goodbye to the replica or the Sentinels
        counted_at_kill = counted

        async def promoted() -> bool:
            addr = await _ask(sentinel_ports[0], "SENTINEL", "get-master-addr-by-name", NAME)
            return addr is not None and int(addr[1]) == replica.port

        await wait_for(promoted, timeout=30)
        new = aredis.from_url(replica.url, decode_responses=True)
        await wait_for(lambda: _is_master(new), timeout=10)

        # The controller's next ring write lands on the new master, under the same fence.
        async def write() -> int | None:
            with contextlib.suppress(Exception):
                return await controller.set_membership(
                    {"nezha-cache-0": "127.0.0.11:8080", "nezha-cache-1": "127.0.0.12:8080"}, fence=fence)
            return None

        second = await _eventually(write, timeout=15)
        assert second == first + 1
        assert await new.hgetall("nezha:ring:nodes") == {"nezha-cache-0": "127.0.0.11:8080",
                                                         "nezha-cache-1": "127.0.0.12:8080"}
        # Still fenced: a deposed leader's write is refused by the new master too.
        with pytest.raises(Deposed):
            await controller.set_membership({}, fence=Fence(generation=2, holder="nezha-controller-old"))
        await wait_for(lambda: all(n.membership.epoch == second for n in nodes), timeout=10)

        # Nodes keep reporting: what they counted after the kill reaches the new master.
        await asyncio.sleep(0.3)
        stop.set()
        await reporting
        await wait_for(lambda: all(n.status()["redis"] == "ok" and n.buffered == 0 for n in nodes), timeout=15)
        for node in nodes:
            assert await node.flush()
        hits = int(await new.hget("nezha:stats:cluster", "hits") or 0)
        # Lost at most what the dead master took but had not replicated when it died.
        assert counted - counted_at_kill <= hits <= counted
        await new.aclose()

        stats = subprocess.run([sys.executable, "-m", "nezha", "stats", "--json", "--redis-url", url],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert stats.returncode == 0, stats.stderr
        shown = json.loads(stats.stdout)
        assert shown["cluster"]["hits"] == hits and shown["cluster"]["bytes_served"] == 10 * hits
        assert set(shown["nodes"]) == {"nezha-cache-0", "nezha-cache-1"}
        assert PASSWORD not in stats.stdout + stats.stderr
    finally:
        stop.set()
        for index in (*nodes, controller):
            await index.close(flush_timeout=0.5)


async def _linked(client: aredis.Redis) -> bool:
    try:
        return (await client.info("replication")).get("master_link_status") == "up"
    except (OSError, aredis.RedisError):
        return False


async def _is_master(client: aredis.Redis) -> bool:
    try:
        return (await client.execute_command("ROLE"))[0] == "master"
    except (OSError, aredis.RedisError):
        return False


async def _eventually(attempt, *, timeout: float):
    """The first non-None result of `attempt`, tried until `timeout` seconds pass."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        result = await attempt()
        if result is not None:
            return result
        await asyncio.sleep(0.2)
    raise AssertionError(f"nothing in {timeout}s")
