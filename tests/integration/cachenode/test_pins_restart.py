"""A node restarted while a workload runs keeps its pins: they come back from its data directory
(cachenode/store/pins_file.py) before the start-up's fit, without the controller asking again."""

from __future__ import annotations

import os
import time

import aiohttp

from cachenode.store.disk import Store
from cachenode.store.objects import Meta

from nezha.config import Origin
from nezha.keys import key_for, parse_target
from tests.integration.cachenode.conftest import HOST

OBJECT = 100_000
KEY = "http://www.cs.toronto.edu/datasets/train.jsonl"


async def pins_of(session: aiohttp.ClientSession, port: int) -> dict:
    async with session.get(f"http://127.0.0.1:{port}/_nezha/pins") as r:
        assert r.status == 200
        return await r.json()


async def read(session: aiohttp.ClientSession, port: int, path: str, *, only_cached: bool = False) -> int:
    headers = {"Host": HOST, **({"Cache-Control": "only-if-cached"} if only_cached else {})}
    async with session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r:
        await r.read()
        return r.status


async def test_a_restarted_node_holds_the_pins_it_had_and_a_scan_of_twice_its_capacity_keeps_them(
        origin, node_process, session):
    for prefix, count in (("/w/", 3), ("/scan/", 20)):
        for i in range(count):
            origin.put(f"{prefix}{i}.bin", bytes([i]) * OBJECT, headers={"Cache-Control": "max-age=3600"})
    args = ("--capacity", "1000000")
    node = node_process(origin.url, args=args)
    await node.ready(session)
    for i in range(3):
        assert await read(session, node.port, f"/w/{i}.bin") == 200
    keys = [key_for(parse_target(f"/w/{i}.bin", HOST), Origin(host=HOST, upstream=origin.url)) for i in range(3)]
    async with session.post(f"http://127.0.0.1:{node.port}/_nezha/pins",
                            json={"workload": "Job/ml/train", "pin": keys}) as r:
        assert r.status == 200 and (await r.json())["pinned_bytes"] == 3 * OBJECT
    async with session.post(f"http://127.0.0.1:{node.port}/_nezha/pins",
                            json={"workload": "Job/ml/old", "pin": keys[:1]}) as r:
        assert r.status == 200
    async with session.post(f"http://127.0.0.1:{node.port}/_nezha/pins",
                            json={"workload": "Job/ml/old", "release": 0}) as r:
        assert r.status == 200

    node.stop()
    again = node_process(origin.url, args=args, port=node.port)
    await again.ready(session)
    assert (await pins_of(session, again.port))["workloads"] == {"Job/ml/train": 3 * OBJECT}, \
        "the pins that held when it stopped, and only those"

    # Twice the capacity, each object read a few times in a row (what the eviction policy lets in).
    for i in [i for i in range(20) for _ in range(3)]:
        assert await read(session, again.port, f"/scan/{i}.bin") == 200
    assert [await read(session, again.port, f"/w/{i}.bin", only_cached=True) for i in range(3)] == [200] * 3
    assert [await read(session, again.port, f"/scan/{i}.bin", only_cached=True) for i in range(3)] == [504] * 3, \
        "the scan evicted what was not pinned"
    assert sum(origin.requests[f"/w/{i}.bin"] for i in range(3)) == 3


async def test_right_after_a_restart_the_pins_count_objects_the_background_scan_has_not_reached(tmp_path):
    store = Store(tmp_path, pinned_capacity=10 * OBJECT)
    await store.open()
    temp = await store.new_temp()
    os.close(temp.read_fd)
    await store.write(temp, b"x" * OBJECT)
    now = time.time()
    await store.commit(temp, Meta(key=KEY, url=KEY, host="www.cs.toronto.edu", size=0, headers=(),
                                  stored_at=now, expires_at=now + 600))
    assert store.pins.pin("Job/ml/train", [KEY]).pinned_bytes == OBJECT
    await store.close()

    again = Store(tmp_path, pinned_capacity=10 * OBJECT)
    await again.open(background=True)
    assert again.load_progress < 1.0  # nothing scanned yet
    assert again.pins.by_workload() == {"Job/ml/train": OBJECT}
    assert again.stored_size(KEY) == OBJECT, "a prefetch's check of what is stored asks the same way"
    await again.loaded()
    assert len(again) == 1
    await again.close()
