"""A node holding 100,000 objects serves at once after a restart: its index
loads in the background (cachenode/store/loading.py), a request for an
object not loaded yet finds it by its hashed path, and once loaded every
object is still there, exact; `/readyz`, the metric and `nezha stats` say
how far the load got."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import redis.asyncio as aioredis

from cachenode.store.disk import Store
from cachenode.store.layout import place
from cachenode.store.objects import Meta
from nezha.cli import main

HOST = "www.cs.toronto.edu"
COUNT = 100_000


def body(i: int) -> bytes:
    return f"{i:07d}".encode() * 32


@pytest.fixture(scope="module")
def large_store(tmp_path_factory):
    """COUNT objects of 224 bytes in a store's folder, built with the store's own layout (without fsync)."""
    root = tmp_path_factory.mktemp("large")
    objects = root / "objects"
    now = time.time()
    for i in range(COUNT):
        key = f"http://{HOST}/imagenet/train/{i:07d}.JPEG"
        place(objects, Meta(key=key, url=key, host=HOST, size=0, headers=(("Content-Type", "image/jpeg"),),
                            stored_at=now, expires_at=now + 86400), body(i))
    return root


async def loaded_metric(session, node) -> float:
    async with session.get(node.url + "/metrics") as r:
        found = re.search(r"^nezha_store_loaded_ratio (\S+)$", await r.text(), re.MULTILINE)
    assert found, "no nezha_store_loaded_ratio in /metrics"
    return float(found.group(1))


async def test_a_node_with_100k_objects_answers_its_first_hit_within_a_second(large_store, make_node, session,
                                                                               origin):
    started = time.monotonic()
    node = await make_node(data_dir=large_store)
    status, headers, got = await node.get(session, "/imagenet/train/0099999.JPEG")
    first_hit = time.monotonic() - started
    assert status == 200 and got == body(99_999) and headers["X-Nezha-Cache"] == "hit"
    assert first_hit < 1.0, first_hit
    assert sum(origin.requests.values()) == 0
    async with session.get(node.url + "/readyz") as r:
        loading = (await r.json())["store_loaded"]
    metric_loading = await loaded_metric(session, node)
    await node.node.store.loaded()
    async with session.get(node.url + "/readyz") as r:
        assert (await r.json())["store_loaded"] == 1.0
    assert loading < 1.0, "the index was loaded before the node answered: nothing shows it loads in the background"
    # An operator sees it too: the metric moves from under 1 to 1 as /readyz does.
    assert 0.0 <= metric_loading < 1.0 and await loaded_metric(session, node) == 1.0
    assert len(node.node.store) == COUNT


async def test_every_object_of_a_store_loaded_in_the_background_is_served_exact(large_store):
    store = Store(large_store)
    await store.open(background=True)
    # Before the scan reaches them, objects are found by their hashed path.
    early = [store.lookup(f"http://{HOST}/imagenet/train/{i:07d}.JPEG") for i in range(0, COUNT, 997)]
    assert all(m is not None for m in early)
    await store.loaded()
    assert len(store) == COUNT and store.load_progress == 1.0
    for i in range(COUNT):
        meta = store.lookup(f"http://{HOST}/imagenet/train/{i:07d}.JPEG")
        with open(store.data_path(meta), "rb") as f:
            assert f.read() == body(i), i


async def test_an_object_removed_while_the_index_loads_does_not_come_back(large_store, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(large_store / "objects" / "00", root / "objects" / "00")
    shutil.copytree(large_store / "objects" / "ff", root / "objects" / "ff")
    store = Store(root)
    await store.open(background=True)
    keys = []
    for sub in ("00", "ff"):
        meta_file = next((root / "objects" / sub).glob("*.meta"))
        import json

        keys.append(json.loads(meta_file.read_text())["key"])
    gone = await store.remove(keys[1])
    assert [m.key for m in gone] == [keys[1]]
    await store.loaded()
    assert keys[1] not in store and keys[0] in store


async def test_nezha_stats_shows_how_far_a_nodes_store_has_loaded(large_store, make_node, session, redis_server,
                                                                   capsys):
    """`nezha stats` LOADED: a node's start-up scan as its stats hash reports it, under 100% while the
    index loads in the background and 100.0% once it is done (docs/redis-schema.md, `store_loaded`)."""
    r = aioredis.from_url(redis_server.url, decode_responses=True)

    async def reported() -> float | None:
        raw = await r.hget("nezha:stats:node:nezha-cache-0", "store_loaded")
        return None if raw is None else float(raw)

    async def loaded_column() -> str:
        code = await asyncio.to_thread(main, ["stats", "--redis-url", redis_server.url])
        out, _ = capsys.readouterr()
        lines = out.splitlines()
        # The node runs in this process: its log lines share the captured stdout. The table starts at its header.
        lines = lines[next(i for i, line in enumerate(lines) if line.startswith("SCOPE ")):]
        assert code == 0 and lines[0].split()[-1] == "LOADED", out
        rows = {tuple(line.split()[:2]): line.split()[-1] for line in lines[1:] if line.startswith(("cluster", "node"))}
        assert rows[("cluster", "-")] == "-", out  # a node's own figure, not summed over the cluster
        return rows[("node", "nezha-cache-0")]

    try:
        node = await make_node(data_dir=large_store, redis_url=redis_server.url, node_id="nezha-cache-0")
        for _ in range(500):  # the node's first flush, about a second after it starts
            if await reported() is not None:
                break
            await asyncio.sleep(0.01)
        before = await reported()
        shown = await loaded_column()
        after = await reported()
        assert before is not None and after is not None
        assert before < 1.0, "the index was loaded before the node first reported: nothing shows it loading"
        assert shown.endswith("%"), shown
        # What the node reported between the two reads, as a percentage: not 0-1, not 100%, not "-".
        assert 100 * before - 0.05 <= float(shown[:-1]) <= 100 * after + 0.05, (before, shown, after)
        assert float(shown[:-1]) < 100.0

        await node.node.store.loaded()
        for _ in range(500):
            if await reported() == 1.0:
                break
            await asyncio.sleep(0.01)
        assert await loaded_column() == "100.0%"
    finally:
        await r.aclose()
