"""`nezha ring set|show` and `nezha stats`, run in-process against a real redis-server."""

from __future__ import annotations

import asyncio
import json

import pytest

from nezha.index.handle import Index
from nezha.cli import main
from testkit.ports import free_port

HOST = "www.cs.toronto.edu"
CIFAR = 169_001_437


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ring_set_writes_a_membership_that_ring_show_prints(redis_server, capsys):
    url = redis_server.url
    code, out, _ = run(capsys, "ring", "set", "nezha-cache-0=127.0.0.1:8080", "nezha-cache-1=127.0.0.1:8081",
                       "--weight", "nezha-cache-1=3", "--redis-url", url)
    assert code == 0
    assert out.splitlines()[0] == "epoch 1, 2 node(s)"
    code, out, _ = run(capsys, "ring", "show", "--redis-url", url)
    assert code == 0
    assert out.splitlines() == [
        "epoch 1, 2 node(s)",
        "NODE           ADDRESS         WEIGHT  SHARE",
        "nezha-cache-0  127.0.0.1:8080  1       25.0%",
        "nezha-cache-1  127.0.0.1:8081  3       75.0%",
    ]
    run(capsys, "ring", "set", "nezha-cache-0=127.0.0.1:8080", "--redis-url", url)
    code, out, _ = run(capsys, "ring", "show", "--json", "--redis-url", url)
    assert json.loads(out) == {"epoch": 2, "nodes": {"nezha-cache-0": "127.0.0.1:8080"},
                               "weights": {"nezha-cache-0": 1}}


async def test_ring_set_reaches_a_running_node_within_a_second(redis_server, capsys):
    node = Index(redis_url=redis_server.url, node_id="nezha-cache-0", refresh_interval=60)
    await node.start()
    try:
        code = await asyncio.to_thread(main, ["ring", "set", "nezha-cache-0=127.0.0.1:8080",
                                              "--redis-url", redis_server.url])
        for _ in range(100):
            if node.membership is not None:
                break
            await asyncio.sleep(0.01)
        assert code == 0
        assert node.membership.nodes == {"nezha-cache-0": "127.0.0.1:8080"}
    finally:
        await node.close()


def test_ring_show_before_any_membership_says_how_to_write_one(redis_server, capsys):
    code, out, _ = run(capsys, "ring", "show", "--redis-url", redis_server.url)
    assert code == 0
    assert "nezha ring set ID=HOST:PORT" in out


async def _record_traffic(url: str) -> None:
    a = Index(redis_url=url, node_id="nezha-cache-0")
    b = Index(redis_url=url, node_id="nezha-cache-1")
    a.count(HOST, misses=1, bytes_from_origin=CIFAR, bytes_served=CIFAR, objects=1, bytes_stored=CIFAR)
    a.count(HOST, hits=2, bytes_served=2 * CIFAR)
    b.count(HOST, peer_hits=1, bytes_served=CIFAR)
    b.count("images.cocodataset.org", failed_fills=1)
    for index in (a, b):
        assert await index.flush()
        await index.close()


def test_stats_shows_every_node_and_host_with_hit_ratio_and_bytes(redis_server, capsys):
    asyncio.run(_record_traffic(redis_server.url))
    capsys.readouterr()  # the nodes' own log lines
    code, out, _ = run(capsys, "stats", "--json", "--redis-url", redis_server.url)
    assert code == 0
    stats = json.loads(out)
    assert sorted(stats["nodes"]) == ["nezha-cache-0", "nezha-cache-1"]
    assert sorted(stats["hosts"]) == ["images.cocodataset.org", HOST]
    assert stats["cluster"]["hit_ratio"] == 0.75  # 2 hits + 1 peer hit of 4 requests
    assert stats["cluster"]["bytes_served"] == 4 * CIFAR
    assert stats["nodes"]["nezha-cache-0"]["hit_ratio"] == pytest.approx(2 / 3)
    assert stats["hosts"]["images.cocodataset.org"]["hit_ratio"] is None
    assert stats["hosts"]["images.cocodataset.org"]["failed_fills"] == 1

    code, out, _ = run(capsys, "stats", "--redis-url", redis_server.url)
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split()[:6] == ["SCOPE", "NAME", "REPORTED", "HITS", "PEER", "MISSES"]
    assert lines[1].split() == ["cluster", "-", "-", "2", "1", "1", "75.0%", "644.7", "MiB", "161.2", "MiB", "1",
                                "161.2", "MiB", "0", "1", "0", "B", "-", "0", "B", "-"]
    assert [line.split()[:2] for line in lines[2:]] == [
        ["node", "nezha-cache-0"], ["node", "nezha-cache-1"], ["host", "images.cocodataset.org"], ["host", HOST]]
    assert lines[2].split()[2:4] == ["0s", "ago"]  # just flushed


def test_stats_marks_a_node_that_stopped_reporting(redis_server, capsys):
    import redis
    import time

    asyncio.run(_record_traffic(redis_server.url))
    capsys.readouterr()
    # nezha-cache-1 last reported ten minutes ago: stopped, or cut off from Redis.
    redis.Redis.from_url(redis_server.url).hset("nezha:stats:node:nezha-cache-1", "updated_at",
                                                f"{time.time() - 600:.3f}")
    code, out, _ = run(capsys, "stats", "--redis-url", redis_server.url)
    assert code == 0
    rows = {line.split()[1]: line for line in out.splitlines()[2:4]}
    assert "10m ago STALE" in rows["nezha-cache-1"] and "STALE" not in rows["nezha-cache-0"]
    code, out, _ = run(capsys, "stats", "--json", "--redis-url", redis_server.url)
    nodes = json.loads(out)["nodes"]
    assert nodes["nezha-cache-1"]["stale"] is True and nodes["nezha-cache-1"]["age_seconds"] >= 600
    assert nodes["nezha-cache-0"]["stale"] is False


def test_stats_reads_the_url_from_the_environment(redis_server, capsys, monkeypatch):
    monkeypatch.setenv("NEZHA_REDIS_URL", redis_server.url)
    code, out, _ = run(capsys, "stats", "--json")
    assert code == 0
    assert json.loads(out)["cluster"]["hits"] == 0


def test_bad_node_address_is_refused_before_touching_redis(redis_server, capsys):
    import redis

    code, _, err = run(capsys, "ring", "set", "nezha-cache-0=nowhere", "--redis-url", redis_server.url)
    assert code == 2
    assert err.strip() == "nezha ring: address of ring node 'nezha-cache-0' must be HOST:PORT, got 'nowhere'"
    assert redis.Redis.from_url(redis_server.url).exists("nezha:ring:epoch") == 0


def test_unreachable_index_exits_1_naming_it(capsys):
    port = free_port()
    code, out, err = run(capsys, "stats", "--redis-url", f"redis://:pw@127.0.0.1:{port}/0")
    assert code == 1
    assert out == ""
    assert f"nezha stats: read stats from redis://:***@127.0.0.1:{port}/0: ConnectionError" in err
    assert ":pw@" not in err


def test_missing_redis_url_says_how_to_give_one(capsys, monkeypatch):
    monkeypatch.delenv("NEZHA_REDIS_URL", raising=False)
    code, _, err = run(capsys, "ring", "show")
    assert code == 2
    assert "pass --redis-url URL or set NEZHA_REDIS_URL" in err
