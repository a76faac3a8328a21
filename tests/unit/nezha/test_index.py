"""The index against fakeredis: what lands in which key, and how the node
behaves when Redis is away. The key names are the documented schema, so the
tests spell them out rather than import them."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest
from structlog.testing import capture_logs

from nezha.index.handle import Index
from nezha.index.connection import redact_url
from nezha.index.membership import check_membership
from nezha.ring import Membership
from nezha.errors import ConfigError
from testkit.waits import wait_for

HOST = "www.cs.toronto.edu"
URL = "http://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
KEY = URL


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server():
    return fakeredis.FakeServer()


@pytest.fixture
def redis(server):
    return fakeredis.FakeAsyncRedis(server=server, decode_responses=True)


@pytest.fixture
async def make_index(server):
    made: list[Index] = []

    def make(node_id: str | None = "nezha-cache-0", **kw) -> Index:
        kw.setdefault("flush_interval", 0.05)
        kw.setdefault("backoff_max", 0.1)
        client = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
        index = Index(redis_url=None, node_id=node_id, client=client, **kw)
        made.append(index)
        return index

    yield make
    for index in made:
        await index.close(flush_timeout=0.5)


async def test_counts_reach_node_host_and_cluster_hashes_after_a_flush(make_index, redis):
    a, b = make_index("nezha-cache-0"), make_index("nezha-cache-1")
    a.count(HOST, hits=2, bytes_served=300)
    a.count("images.cocodataset.org", misses=1, bytes_from_origin=50, bytes_served=50)
    b.count(HOST, peer_hits=1, bytes_served=7)
    assert await redis.keys("nezha:stats:*") == []  # nothing sent before the flush
    assert await a.flush() and await b.flush()

    node = await redis.hgetall("nezha:stats:node:nezha-cache-0")
    assert {k: v for k, v in node.items() if k != "updated_at"} == {
        "hits": "2", "misses": "1", "bytes_from_origin": "50", "bytes_served": "350"}
    assert await redis.hgetall("nezha:stats:host:www.cs.toronto.edu") == {
        "hits": "2", "peer_hits": "1", "bytes_served": "307"}
    assert await redis.hgetall("nezha:stats:cluster") == {
        "hits": "2", "misses": "1", "peer_hits": "1", "bytes_from_origin": "50", "bytes_served": "357"}


async def test_eviction_deltas_lower_objects_and_bytes_stored(make_index, redis):
    index = make_index()
    index.count(HOST, objects=1, bytes_stored=1000)
    index.count(HOST, objects=1, bytes_stored=500)
    index.count(HOST, objects=-1, bytes_stored=-1000, evictions=1)
    await index.flush()
    assert await redis.hgetall("nezha:stats:host:www.cs.toronto.edu") == {
        "objects": "1", "bytes_stored": "500", "evictions": "1"}


def test_unknown_stats_field_is_refused_at_the_call():
    index = Index(redis_url=None, node_id="n")
    with pytest.raises(ValueError, match="unknown stats field 'hit'"):
        index.count(HOST, hit=1)
    with pytest.raises(TypeError, match="'hits' takes an int delta, got 1.5"):
        index.count(HOST, hits=1.5)


async def test_counts_are_flushed_in_the_background_about_every_interval(make_index, redis):
    """The background loop's first tick, one interval after start, carries the count: not close(), not a
    burst's early flush (`_due`), not a later tick. Which flush sent it is recorded, not how long it took,
    which on a loaded machine says nothing of the loop."""
    index = make_index(flush_interval=0.1)
    loop = asyncio.get_running_loop()
    flushes: list[tuple[str, bool, float]] = []  # (the flushing task's name, counts pending, seconds after start)
    flush, due = index.stats.flush, index.stats._due.set
    bursts: list[bool] = []

    async def recorded() -> bool:
        flushes.append((asyncio.current_task().get_name(), bool(index.stats._counters), loop.time() - started))
        return await flush()

    index.stats.flush = recorded
    index.stats._due.set = lambda: (bursts.append(True), due())
    started = loop.time()
    await index.start()
    index.count(HOST, hits=1)
    await wait_for(lambda: redis.hget("nezha:stats:cluster", "hits"))
    before_close = list(flushes)
    await index.close()
    assert before_close, "in Redis before close(), so by the background loop"
    name, pending, at = before_close[0]
    assert (name, pending) == ("index-flush", True), "the loop's first flush sent the count"
    assert at >= 0.08, "after the loop waited its interval (0.8 to 1.0 of it)"
    assert bursts == [], "not a burst's early flush"


async def test_a_batch_on_its_way_to_redis_still_counts_as_buffered(make_index, redis, monkeypatch):
    index = make_index()
    index.count(HOST, misses=1, bytes_from_origin=10)
    index.object_stored(KEY, host=HOST, size=10)
    sending, release = asyncio.Event(), asyncio.Event()
    send = index.stats._send

    async def slow_send(*args):
        sending.set()
        await release.wait()
        return await send(*args)

    monkeypatch.setattr(index.stats, "_send", slow_send)
    flush = asyncio.ensure_future(index.flush())
    await sending.wait()
    # Taken out of the buffer, not yet in Redis: a reader told 0 here would read stats without them.
    assert index.buffered == 2 and await redis.hget("nezha:stats:cluster", "misses") is None
    release.set()
    assert await flush
    assert index.buffered == 0 and await redis.hget("nezha:stats:cluster", "misses") == "1"


async def test_stored_object_is_located_on_every_node_that_holds_it(make_index):
    clock = Clock()
    a, b = make_index("nezha-cache-0", clock=clock), make_index("nezha-cache-1", clock=clock)
    a.object_stored(KEY, host=HOST, size=169_001_437)
    clock.now += 5
    b.object_stored(KEY, host=HOST, size=169_001_437)
    await a.flush()
    await b.flush()
    assert await a.locations(KEY) == {"nezha-cache-0", "nezha-cache-1"}
    assert await a.object_info(KEY) == {
        "host": HOST, "size": 169_001_437, "stored_at": clock.now, "last_access": clock.now,
        "nodes": {"nezha-cache-0", "nezha-cache-1"}}
    assert await a.locations("http://www.cs.toronto.edu/other") == set()


async def test_removing_the_last_copy_forgets_the_object(make_index, redis):
    a, b = make_index("nezha-cache-0"), make_index("nezha-cache-1")
    a.object_stored(KEY, host=HOST, size=10)
    b.object_stored(KEY, host=HOST, size=10)
    await a.flush()
    await b.flush()
    a.object_removed(KEY, host=HOST, size=10)
    await a.flush()
    assert await a.locations(KEY) == {"nezha-cache-1"}
    assert await redis.hget(f"nezha:obj:{KEY}", "size") == "10"
    b.object_removed(KEY, host=HOST, size=10)
    await b.flush()
    assert await b.locations(KEY) == set()
    assert await b.object_info(KEY) is None
    assert await redis.exists(f"nezha:obj:{KEY}") == 0


async def test_store_remove_store_in_one_batch_leaves_the_object_held(make_index):
    index = make_index()
    index.object_stored(KEY, host=HOST, size=10)
    index.object_removed(KEY, host=HOST, size=10)
    index.object_stored(KEY, host=HOST, size=11)
    await index.flush()
    info = await index.object_info(KEY)
    assert info["nodes"] == {"nezha-cache-0"} and info["size"] == 11


async def test_access_moves_last_access_forward_but_never_resurrects_an_object(make_index, redis):
    clock = Clock()
    index = make_index(clock=clock)
    index.object_stored(KEY, host=HOST, size=10)
    await index.flush()
    clock.now += 60
    index.object_accessed(KEY)
    index.object_accessed("http://www.cs.toronto.edu/never-stored")
    await index.flush()
    assert (await index.object_info(KEY))["last_access"] == clock.now
    assert await redis.exists("nezha:obj:http://www.cs.toronto.edu/never-stored") == 0
    index.object_removed(KEY, host=HOST, size=10)
    index.object_accessed(KEY)
    await index.flush()
    assert await redis.exists(f"nezha:obj:{KEY}") == 0


async def test_a_failed_flush_keeps_every_update_and_sends_it_after_recovery(make_index, server, redis):
    index = make_index()
    index.count(HOST, hits=1)
    assert await index.flush()
    server.connected = False
    with capture_logs() as logs:
        index.count(HOST, hits=2, bytes_served=10)
        index.object_stored(KEY, host=HOST, size=10)
        assert not await index.flush()
        index.count(HOST, hits=4)
        assert not await index.flush()
        status = index.status()
        server.connected = True
        assert await index.flush()
    assert status["redis"] == "degraded"
    assert "ConnectionError" in status["reason"]
    assert status["buffered"] == 2  # one object update, one host with counters
    assert index.status() == {"redis": "ok", "reason": None, "buffered": 0, "dropped": 0, "epoch": None}
    assert await redis.hget("nezha:stats:cluster", "hits") == "7"
    assert await redis.hget("nezha:stats:node:nezha-cache-0", "bytes_served") == "10"
    assert await index.locations(KEY) == {"nezha-cache-0"}
    assert [e["event"] for e in logs] == ["index_degraded", "index_recovered"]


async def test_a_full_buffer_drops_oldest_accesses_first_and_never_counters(make_index, server, redis):
    index = make_index(max_buffered=3)
    server.connected = False
    with capture_logs() as logs:
        index.object_stored("k1", host=HOST, size=1)
        index.object_accessed("k1")
        index.object_accessed("k2")
        index.object_stored("k3", host=HOST, size=1)  # drops access k1
        index.object_stored("k4", host=HOST, size=1)  # drops access k2
        index.object_stored("k5", host=HOST, size=1)  # drops store k1
        for _ in range(1000):
            index.count(HOST, hits=1)
    assert index.status()["dropped"] == 3
    assert [e["event"] for e in logs] == ["index_updates_dropped"]
    server.connected = True
    assert await index.flush()
    assert [await index.locations(k) for k in ("k1", "k3", "k4", "k5")] == [
        set(), {"nezha-cache-0"}, {"nezha-cache-0"}, {"nezha-cache-0"}]
    assert await redis.hget("nezha:stats:cluster", "hits") == "1000"


async def test_membership_write_bumps_the_epoch_and_reaches_another_node_by_pubsub(make_index):
    writer = make_index(None)
    reader = make_index("nezha-cache-1", refresh_interval=60)  # the re-read cannot be what delivers it
    seen: list[Membership] = []
    reader.on_membership(seen.append)
    await reader.start()
    await wait_for(lambda: reader.status()["redis"] == "ok")
    first = await writer.set_membership({"nezha-cache-0": "127.0.0.1:8080"})
    second = await writer.set_membership({"nezha-cache-0": "127.0.0.1:8080", "nezha-cache-1": "127.0.0.1:8081"},
                                         {"nezha-cache-1": 2})
    # The re-read is a minute away and the wait gives up at 30 s: only pub/sub delivers in time.
    await wait_for(lambda: reader.membership and reader.membership.epoch == second, timeout=30)
    await reader.close()
    assert (first, second) == (1, 2)
    assert seen[-1] == Membership(epoch=2, nodes={"nezha-cache-0": "127.0.0.1:8080",
                                                  "nezha-cache-1": "127.0.0.1:8081"},
                                  weights={"nezha-cache-0": 1, "nezha-cache-1": 2})
    assert seen[-1].ring().nodes == {"nezha-cache-0": 1, "nezha-cache-1": 2}
    assert writer.membership == seen[-1]


async def test_periodic_reread_finds_a_change_whose_message_was_lost(make_index, redis):
    reader = make_index(refresh_interval=0.1)
    await reader.start()
    # Written by hand and never published.
    await redis.set("nezha:ring:epoch", 7)
    await redis.hset("nezha:ring:nodes", mapping={"a": "127.0.0.1:1"})
    await wait_for(lambda: reader.membership is not None, timeout=1.0)
    await reader.close()
    assert reader.membership == Membership(epoch=7, nodes={"a": "127.0.0.1:1"}, weights={"a": 1})


async def test_last_membership_is_kept_while_redis_is_away(make_index, server):
    writer, node = make_index(None), make_index(refresh_interval=0.05)
    await writer.set_membership({"a": "127.0.0.1:1"})
    await node.start()
    assert node.membership.epoch == 1
    server.connected = False
    await wait_for(lambda: node.status()["redis"] == "degraded")
    await asyncio.sleep(0.2)
    status = node.status()
    await node.close()
    assert node.membership.nodes == {"a": "127.0.0.1:1"}
    assert status["epoch"] == 1


async def test_start_never_raises_when_redis_is_unreachable():
    from testkit.ports import free_port

    index = Index(redis_url=f"redis://127.0.0.1:{free_port()}/0", node_id="n", flush_interval=0.05)
    await index.start()
    index.count(HOST, hits=1)
    status = index.status()
    await index.close(flush_timeout=0.5)
    assert status["redis"] == "degraded"
    assert "Connect" in status["reason"]
    assert status["buffered"] == 1


async def test_without_redis_the_index_is_disabled_and_membership_is_local():
    index = Index(redis_url=None, node_id="n")
    seen: list[int] = []
    index.on_membership(lambda m: seen.append(m.epoch))
    await index.start()
    index.count(HOST, hits=1)
    index.object_stored(KEY, host=HOST, size=1)
    assert await index.set_membership({"n": "127.0.0.1:8080"}) == 1
    assert await index.set_membership({"n": "127.0.0.1:8081"}) == 2
    assert (await index.get_membership()).nodes == {"n": "127.0.0.1:8081"}
    assert await index.locations(KEY) == set()
    assert index.status() == {"redis": "disabled", "reason": None, "buffered": 0, "dropped": 0, "epoch": 2}
    assert seen == [1, 2]
    await index.close()


def test_a_callback_registered_late_gets_the_known_membership_at_once():
    index = Index(redis_url=None, node_id="n")
    asyncio.run(index.set_membership({"n": "127.0.0.1:8080"}))
    seen: list[int] = []
    index.on_membership(lambda m: seen.append(m.epoch))
    assert seen == [1]


@pytest.mark.parametrize(("nodes", "weights", "message"), [
    ({"a": "nowhere"}, None, "address of ring node 'a' must be HOST:PORT, got 'nowhere'"),
    ({"a b": "h:1"}, None, "ring node id 'a b' must be a non-empty string without spaces"),
    ({"a": "h:1"}, {"b": 2}, "weight given for 'b', which is not among the ring nodes ['a']"),
    ({"a": "h:1"}, {"a": 0}, "weight of ring node 'a' must be a positive int, got 0"),
])
def test_bad_membership_is_refused_naming_the_entry(nodes, weights, message):
    with pytest.raises(ConfigError) as e:
        check_membership(nodes, weights)
    assert str(e.value) == message


def test_redis_url_of_another_scheme_is_refused_without_showing_the_password():
    with pytest.raises(ConfigError) as e:
        Index(redis_url="http://:hunter2@127.0.0.1:6379", node_id="n")
    assert "hunter2" not in str(e.value) and "http://:***@127.0.0.1:6379" in str(e.value)
    assert redact_url("rediss://user:pw@redis.example:6380/1") == "rediss://user:***@redis.example:6380/1"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


async def test_close_sends_what_is_still_buffered(make_index, redis):
    index = make_index(flush_interval=60)
    await index.start()
    index.count(HOST, failed_fills=1)
    index.object_stored(KEY, host=HOST, size=3)
    await index.close()
    assert await redis.hget("nezha:stats:cluster", "failed_fills") == "1"
    assert await redis.hget(f"nezha:obj:{KEY}", "node:nezha-cache-0") == "1"


async def test_owners_per_key_published_with_the_ring_reach_every_node_and_override_its_own(make_index):
    """nezha:ring:replicas is written in the ring's MULTI; a node with --replicas 1 then keeps 2 owners."""
    from cachenode.cluster_view import ClusterView

    writer, node = make_index(node_id=None), make_index(node_id="n1")
    await writer.start()
    await node.start()
    view = ClusterView(node_id="n1", replicas=1)
    node.on_membership(view.update)
    await writer.set_membership({"n1": "127.0.0.1:1", "n2": "127.0.0.1:2"}, replicas=2)
    for _ in range(200):
        if view.replicas == 2:
            break
        await asyncio.sleep(0.01)
    assert view.replicas == 2 and len(view.owners("http://h/k")) == 2
    await writer.set_membership({"n1": "127.0.0.1:1", "n2": "127.0.0.1:2"})  # left out: unchanged
    assert (await writer.get_membership()).replicas == 2
    await writer.set_membership({"n1": "127.0.0.1:1", "n2": "127.0.0.1:2"}, replicas=None)
    for _ in range(200):
        if view.replicas == 1:
            break
        await asyncio.sleep(0.01)
    assert view.replicas == 1 and (await writer.get_membership()).replicas is None
    with pytest.raises(ConfigError):
        await writer.set_membership({"n1": "127.0.0.1:1"}, replicas=0)
