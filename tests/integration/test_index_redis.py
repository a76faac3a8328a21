"""The index against a real redis-server on 127.0.0.1: membership reaches
other nodes through pub/sub, a node outlives Redis, passwords work, and the
embedded default runs with or without redis-server installed."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio as aredis
from structlog.testing import capture_logs

from nezha.index.embedded import embedded_index
from nezha.index.handle import Index
from nezha.ring import Membership
from testkit.redis_server import RedisSentinel, RedisServer, TLSFiles
from testkit.tools import require_tool
from testkit.waits import answers, wait_for

HOST = "www.cs.toronto.edu"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def indexes():
    made: list[Index] = []

    def make(url: str, node_id: str | None, **kw) -> Index:
        index = Index(redis_url=url, node_id=node_id, **kw)
        made.append(index)
        return index

    yield make
    for index in made:
        await index.close(flush_timeout=0.5)


async def test_membership_change_reaches_every_other_node_by_pubsub_not_the_periodic_reread(redis_server, indexes):
    # The re-read runs once a minute and the wait below gives up at 30 s, so
    # only the published message can deliver the change in time. How fast it
    # travels is a measure, printed, not a bound a loaded box must meet.
    nodes = [indexes(redis_server.url, f"nezha-cache-{i}", refresh_interval=60) for i in range(3)]
    arrived: dict[str, float] = {}
    for index in nodes:
        await index.start()
        index.on_membership(lambda m, n=index.node_id: arrived.setdefault(n, time.monotonic()))
    writer = indexes(redis_server.url, None)
    await asyncio.sleep(0.1)  # subscriptions are made by background tasks
    start = time.monotonic()
    epoch = await writer.set_membership({f"nezha-cache-{i}": f"127.0.0.1:{8080 + i}" for i in range(3)})
    await wait_for(lambda: len(arrived) == 3, timeout=30)
    delays_ms = sorted((t - start) * 1000 for t in arrived.values())
    print(f"ring propagation ms: {[round(d, 1) for d in delays_ms]}")
    assert all(index.membership.epoch == epoch for index in nodes)


async def test_with_redis_killed_counting_goes_on_and_buffered_stats_arrive_after_it_returns(redis_server, indexes,
                                                                                            monkeypatch):
    node = indexes(redis_server.url, "nezha-cache-0", flush_interval=0.1, backoff_max=0.2)
    await node.set_membership({"nezha-cache-0": "127.0.0.1:8080"})
    await node.start()
    observer = aredis.from_url(redis_server.url, decode_responses=True)
    node.count(HOST, hits=1)
    await wait_for(lambda: observer.hget("nezha:stats:cluster", "hits"), timeout=2)
    # Redis has applied that flush; wait until the node has its reply too (the flush
    # lock), or the kill could cut the reply and the node would rightly send it again.
    assert await node.flush()

    with capture_logs() as logs:
        redis_server.stop(kill=True)
        # Counting goes on: count() buffers and returns, making no Redis call, so a request that counts
        # never waits on a connect to a Redis that is gone. Every connect this process starts while it
        # counts is recorded (no await runs between the calls, so none is the background flush's).
        connects = []
        real_connect = socket.socket.connect

        def recorded_connect(sock, address):
            connects.append(address)
            return real_connect(sock, address)

        monkeypatch.setattr(socket.socket, "connect", recorded_connect)
        start = time.perf_counter()
        for _ in range(10_000):
            node.count(HOST, hits=1, bytes_served=100)
        counting_s = time.perf_counter() - start
        monkeypatch.undo()
        node.object_stored("http://www.cs.toronto.edu/a", host=HOST, size=5)
        await wait_for(lambda: node.status()["redis"] == "degraded", timeout=3)
        degraded = node.status()
        await asyncio.sleep(0.5)  # several failed flushes with backoff

        redis_server.start()  # same port, empty: no persistence
        await observer.aclose()
        observer = aredis.from_url(redis_server.url, decode_responses=True)
        await wait_for(lambda: observer.hget("nezha:stats:cluster", "hits"), timeout=5)
        await wait_for(lambda: node.status()["redis"] == "ok", timeout=5)

    print(f"10000 count() calls with Redis down: {counting_s * 1000:.1f} ms")  # a measure, not a bound
    assert connects == [], "count() tried to reach Redis"
    assert degraded["buffered"] == 2 and degraded["epoch"] == 1
    assert "Connect" in degraded["reason"]
    assert await observer.hgetall("nezha:stats:host:www.cs.toronto.edu") == {
        "hits": "10000", "bytes_served": "1000000"}
    assert await node.locations("http://www.cs.toronto.edu/a") == {"nezha-cache-0"}
    # The new Redis has no membership; the node keeps the ring it had.
    assert await node.get_membership() is None
    assert node.membership == Membership(epoch=1, nodes={"nezha-cache-0": "127.0.0.1:8080"},
                                         weights={"nezha-cache-0": 1})
    events = [e["event"] for e in logs]
    assert events.count("index_degraded") == 1 and events.count("index_recovered") == 1
    await observer.aclose()


async def test_after_redis_returns_no_command_runs_on_a_connection_pooled_before_it_went_away(
        redis_server, indexes):
    """Four reads at once leave four connections in the pool; Redis is killed and a flush fails on one.
    Once Redis is back, four reads at once must all succeed: the other three pooled connections are dead,
    and had one been drawn (by the watch's new subscription, or a flush) its part would report a second
    outage right after the recovery, `index_degraded` and `index_recovered` twice for one."""
    node = indexes(redis_server.url, "nezha-cache-0")
    epoch = await node.set_membership({"nezha-cache-0": "127.0.0.1:8080"})
    await asyncio.gather(*(node.get_membership() for _ in range(4)))
    assert len(node.conn.client.connection_pool._available_connections) == 4, "four connections pooled"

    with capture_logs() as logs:
        redis_server.stop(kill=True)
        node.count(HOST, hits=1)
        assert not await node.flush()
        redis_server.start()  # same port, empty
        read = await asyncio.gather(*(node.get_membership() for _ in range(4)), return_exceptions=True)
        assert await node.flush()

    assert read == [None] * 4, "every read after the outage answered (the new Redis holds no ring)"
    assert [e["event"] for e in logs] == ["index_degraded", "index_recovered"]
    assert node.membership.epoch == epoch


async def test_password_in_the_url_opens_a_protected_redis(tmp_path, indexes):
    server = RedisServer(require_tool("redis-server"), tmp_path, password="s3cr3t-pw")
    server.start()
    try:
        good = indexes(server.url, "nezha-cache-0")
        assert await good.set_membership({"nezha-cache-0": "127.0.0.1:8080"}) == 1
        good.count(HOST, misses=1)
        assert await good.flush()
        assert (await good.read_stats())["nodes"]["nezha-cache-0"]["misses"] == 1

        bad = indexes(server.url.replace("s3cr3t-pw", "wrong-pw"), "nezha-cache-1")
        await bad.start(first_read_timeout=2)
        status = bad.status()
        assert status["redis"] == "degraded"
        assert "AuthenticationError" in status["reason"] and "wrong-pw" not in status["reason"]
        assert "redis://:***@127.0.0.1" in status["reason"]
    finally:
        server.stop(kill=True)


READ_MEMBERSHIP = """
import asyncio, json, sys
from nezha.index.handle import Index
async def main():
    index = Index(redis_url=sys.argv[1], node_id=None)
    m = await index.get_membership()
    print("membership=" + json.dumps({"epoch": m.epoch, "nodes": m.nodes}))
    await index.close()
asyncio.run(main())
"""


@pytest.mark.parametrize("installed", [True, False], ids=["redis-server", "no-redis-server"])
async def test_embedded_index_is_shared_by_node_processes_with_or_without_redis_server(
        installed, tmp_path, monkeypatch, indexes):
    if installed:
        require_tool("redis-server")
    else:
        monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # redis-server cannot be found
    with capture_logs() as logs:
        url, stop = await embedded_index(tmp_path / "index")
    try:
        assert [e["kind"] for e in logs if e["event"] == "embedded_index_started"] == [
            "redis-server" if installed else "fakeredis"]
        assert url.startswith("redis://127.0.0.1:")
        writer, reader = indexes(url, None), indexes(url, "nezha-cache-1", refresh_interval=60)
        await reader.start()
        await asyncio.sleep(0.1)
        epoch = await writer.set_membership({"nezha-cache-0": "127.0.0.1:8080", "nezha-cache-1": "127.0.0.1:8081"})
        await wait_for(lambda: reader.membership and reader.membership.epoch == epoch, timeout=1.0)
        # Another process (as `nezha up` runs its nodes) sees the same index.
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", READ_MEMBERSHIP, url],
                                      capture_output=True, text=True, check=True, cwd=ROOT, timeout=30)
        line = next(x for x in out.stdout.splitlines() if x.startswith("membership="))
        assert json.loads(line.removeprefix("membership=")) == {
            "epoch": epoch, "nodes": {"nezha-cache-0": "127.0.0.1:8080", "nezha-cache-1": "127.0.0.1:8081"}}
    finally:
        await stop()
    assert not answers("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0]))


@pytest.fixture
def tls_redis(tmp_path):
    """A redis-server that speaks only TLS (certificate from a trustme CA) and wants a password."""
    import trustme

    exe = require_tool("redis-server")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(paths["ca"])
    cert.cert_chain_pems[0].write_to_path(paths["cert"])
    cert.private_key_pem.write_to_path(paths["key"])
    server = RedisServer(exe, tmp_path, password="tls-pw",
                         tls=TLSFiles(cert=paths["cert"], key=paths["key"], ca=paths["ca"]))
    server.start()
    try:
        yield server.port, paths["ca"]
    finally:
        server.stop(kill=True)


async def test_rediss_url_with_password_speaks_tls_to_redis(tls_redis, indexes):
    port, ca = tls_redis
    node = indexes(f"rediss://:tls-pw@127.0.0.1:{port}/0?ssl_ca_certs={ca}", "nezha-cache-0")
    assert await node.set_membership({"nezha-cache-0": "127.0.0.1:8080"}) == 1
    node.count(HOST, hits=1)
    assert await node.flush()
    assert (await node.read_stats())["cluster"]["hits"] == 1
    # Plain redis:// to the TLS port is refused: the TLS path above was really taken.
    plain = indexes(f"redis://:tls-pw@127.0.0.1:{port}/0", "nezha-cache-1")
    await plain.start(first_read_timeout=0.5)
    assert plain.status()["redis"] == "degraded"


async def test_a_sentinel_url_finds_the_master_and_the_ring_lands_there(tmp_path, indexes):
    """redis+sentinel://: the chart's `redis.external.url` for an existing Sentinel-managed Redis."""
    master = RedisServer(require_tool("redis-server"), tmp_path, password="m4ster-pw")
    master.start()
    sentinel = RedisSentinel(require_tool("redis-server"), tmp_path, master=master, name="mymaster")
    sentinel_port = sentinel.port
    sentinel.start()
    try:
        ask = aredis.Redis(host="127.0.0.1", port=sentinel_port, decode_responses=True)

        async def knows_master() -> bool:
            try:
                return await ask.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster") is not None
            except (OSError, aredis.ConnectionError):
                return False

        await wait_for(knows_master, 10)
        await ask.aclose()
        url = f"redis+sentinel://:m4ster-pw@127.0.0.1:{sentinel_port}/mymaster/0"
        index = indexes(url, "nezha-cache-0")
        assert await index.set_membership({"nezha-cache-0": "127.0.0.1:8080"}) == 1
        direct = aredis.from_url(master.url, decode_responses=True)
        try:
            # Written on the master Sentinel named, as the schema says (docs/redis-schema.md).
            assert await direct.hgetall("nezha:ring:nodes") == {"nezha-cache-0": "127.0.0.1:8080"}
        finally:
            await direct.aclose()
        assert (await index.get_membership()).nodes == {"nezha-cache-0": "127.0.0.1:8080"}
        assert "m4ster-pw" not in json.dumps(index.status())
    finally:
        sentinel.stop(kill=True)
        master.stop(kill=True)


async def test_a_nodes_own_figures_are_written_into_its_stats_hash_at_each_flush(redis_server, indexes):
    """Values as they are now (cachenode/store/report.py), beside updated_at; what `nezha stats` reads."""
    figures = {"bytes_only_copy": 4096, "evicted_refused": 3, "hit_ratio_hour": "0.5000"}
    node = indexes(redis_server.url, "nezha-cache-0", report=lambda: dict(figures))
    assert await node.flush()
    figures["evicted_refused"] = 5
    assert await node.flush()
    stats = await node.read_stats()
    mine = stats["nodes"]["nezha-cache-0"]
    assert mine["bytes_only_copy"] == 4096 and mine["evicted_refused"] == 5 and mine["hit_ratio_hour"] == 0.5
    assert "updated_at" in mine


async def test_a_burst_of_small_fills_reaches_redis_in_a_few_batches_long_before_the_interval(redis_server, indexes):
    """A burst of stores flushes every `flush_batch` updates, not once a `flush_interval`: with the
    interval at 30 s, 5,000 stores land within seconds, in a few MULTI/EXECs, and none is dropped
    though they are more than `max_buffered`."""
    node = indexes(redis_server.url, "nezha-cache-0", flush_interval=30, refresh_interval=60, max_buffered=2000,
                   flush_batch=500)
    await node.start()
    r = aredis.from_url(redis_server.url, decode_responses=True)

    async def execs() -> int:
        return (await r.info("commandstats")).get("cmdstat_exec", {}).get("calls", 0)

    async def stored() -> int:
        return sum([1 async for _ in r.scan_iter(match="nezha:obj:*", count=1000)])

    try:
        before = await execs()
        for n in range(5000):
            node.object_stored(f"http://{HOST}/burst/{n}.jpg", host=HOST, size=4096)
            if n % 100 == 99:
                await asyncio.sleep(0.01)  # fills land over many turns of the loop, 10,000 a second
        took = await wait_for(lambda: _equals(stored(), 5000), timeout=10.0)
        batches = await execs() - before
        print(f"5000 stores: {batches} MULTI/EXEC, all in Redis {took:.2f} s after the burst")
        assert node.stats.dropped == 0
        assert 1 <= batches <= 5000 // 500 + 2, f"{batches} transactions for 5000 stores"
    finally:
        await r.aclose()


async def _equals(value, expected) -> bool:
    return await value == expected
