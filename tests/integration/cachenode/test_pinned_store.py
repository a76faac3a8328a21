"""The store keeps pinned objects through eviction (cachenode/store/pins.py), and evicts them once released."""

from __future__ import annotations

from cachenode.store.disk import Store
from tests.integration.cachenode.test_hot_copy_store import key, put


async def test_pinned_objects_survive_a_scan_of_twice_the_capacity_and_go_once_released(tmp_path):
    store = Store(tmp_path, capacity=10_000, pinned_capacity=5_000)
    await store.open()
    for name in ("w1", "w2", "w3"):
        await put(store, name, 1_500)
    done = store.pins.pin("Job/ml/train", [key(n) for n in ("w1", "w2", "w3")])
    assert (done.pinned, done.pinned_bytes, done.room) == (3, 4_500, 500)
    for i in range(20):  # 20 x 1,000 bytes read once each: twice the capacity
        await put(store, f"scan-{i}", 1_000)
    await store.idle()
    assert {key(n) for n in ("w1", "w2", "w3")} <= set(store.keys())
    assert store.used_bytes <= 10_000

    store.pins.release("Job/ml/train", 0)
    for i in range(5):
        await put(store, f"later-{i}", 1_000)
    await store.idle()
    assert not {key(n) for n in ("w1", "w2", "w3")} & set(store.keys()), "released pins keep nothing"


async def test_a_pin_beyond_the_share_is_refused_and_the_object_stays_evictable(tmp_path):
    store = Store(tmp_path, capacity=4_000, pinned_capacity=2_000)
    await store.open()
    await put(store, "big", 2_500)
    done = store.pins.pin("Job/ml/x", [key("big")])
    assert (done.pinned, done.refused, done.refused_bytes, done.room) == (0, 1, 2_500, 2_000)
    for i in range(4):
        await put(store, f"s{i}", 1_000)
    assert key("big") not in store.keys()
