"""The store keeps pinned objects through eviction (cachenode/store/pins.py), and evicts them once released."""

from __future__ import annotations

from cachenode.store.disk import Store
from tests.integration.cachenode.test_hot_copy_store import key, put


async def test_pinned_objects_survive_an_eviction_of_everything_else_and_go_once_released(tmp_path):
    """Room for a fill as large as the store (a reservation: cachenode/store/index.py)
    evicts every object it may. The eviction policy refuses read-once newcomers
    to a full store, so a scan would evict nothing: the reservation is the
    pressure a scan of objects that are read again exerts."""
    store = Store(tmp_path, capacity=10_000, pinned_capacity=5_000)
    await store.open()
    for name in ("w1", "w2", "w3"):
        await put(store, name, 1_500)
    done = store.pins.pin("Job/ml/train", [key(n) for n in ("w1", "w2", "w3")])
    assert (done.pinned, done.pinned_bytes, done.room) == (3, 4_500, 500)
    for i in range(5):
        await put(store, f"other-{i}", 1_000)
    assert len(store.keys()) == 8

    store.reserve(10_000)
    await store.idle()
    assert set(store.keys()) == {key(n) for n in ("w1", "w2", "w3")}, "only the pinned objects stay"
    store.release(10_000)

    store.pins.release("Job/ml/train", 0)
    store.reserve(10_000)
    await store.idle()
    assert not {key(n) for n in ("w1", "w2", "w3")} & set(store.keys()), "released pins keep nothing"
    store.release(10_000)


async def test_a_pin_beyond_the_share_is_refused_and_the_object_stays_evictable(tmp_path):
    store = Store(tmp_path, capacity=4_000, pinned_capacity=2_000)
    await store.open()
    await put(store, "big", 2_500)
    done = store.pins.pin("Job/ml/x", [key("big")])
    assert (done.pinned, done.refused, done.refused_bytes, done.room) == (0, 1, 2_500, 2_000)
    store.reserve(4_000)  # room for a fill as large as the store
    await store.idle()
    assert key("big") not in store.keys()
    store.release(4_000)
