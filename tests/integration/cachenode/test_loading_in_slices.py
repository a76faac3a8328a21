"""A restarted store adds a scanned folder's objects to its index a slice at a
time (cachenode/store/loading.py `SLICE`): the requests that wait meanwhile
are served between slices, and what they do there (a key stored, removed or
looked up) is what the index holds once the folder is loaded."""

from __future__ import annotations

import asyncio
import time

from cachenode.store import loading
from cachenode.store.disk import Store
from tests.support_folders import keys_in, put, read


async def stored(tmp_path, keys: list[str]) -> float:
    store = Store(tmp_path)
    await store.open()
    at = time.time()
    for i, key in enumerate(keys):
        put(store, key, b"body %d" % i, at + i / 1000)
    await store.idle()
    await store.close()
    return at


async def test_a_folder_of_many_objects_is_added_a_slice_between_two_turns_of_the_loop(tmp_path, monkeypatch):
    keys = keys_in("00", 40)
    await stored(tmp_path, keys)
    monkeypatch.setattr(loading, "SLICE", 8)
    again = Store(tmp_path)
    seen: list[int] = []
    ticking = True

    async def ticker() -> None:  # one turn of the loop each: how many objects the index held then
        while ticking:
            seen.append(len(again))
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        await again.open(background=True)
        await again.loaded()
    finally:
        ticking = False
        await task
    try:
        assert len(again) == 40
        steps = [b - a for a, b in zip(seen, seen[1:])]
        assert max(steps) <= 8, f"at most a slice between two turns: {steps}"
        assert sum(1 for s in steps if s) >= 5, "the folder's 40 objects came in several slices"
        assert [read(again, k) for k in keys] == [b"body %d" % i for i in range(40)]
    finally:
        await again.close()


async def test_what_requests_do_between_two_slices_is_what_the_index_holds_after(tmp_path, monkeypatch):
    keys = keys_in("00", 40)
    at = await stored(tmp_path, keys)
    monkeypatch.setattr(loading, "SLICE", 8)
    again = Store(tmp_path)
    done: list[str] = []

    async def between_slices() -> None:  # waits for the folder's first slice, then acts in the next turn
        while len(again) == 0:
            await asyncio.sleep(0)
        assert len(again) < 40, "the folder is still being added"
        late = keys[-1]  # the newest: added in the last slice
        await again.remove(late)
        put(again, keys[-2], b"replaced", at + 10)
        done.append(late)

    task = asyncio.create_task(between_slices())
    await again.open(background=True)
    await again.loaded()
    await task
    try:
        assert done
        assert read(again, keys[-1]) is None, "removed between two slices: not added back by the next"
        assert read(again, keys[-2]) == b"replaced", "replaced between two slices: the new one stays"
        assert [read(again, k) for k in keys[:-2]] == [b"body %d" % i for i in range(38)]
        assert len(again) == 39
    finally:
        await again.close()
