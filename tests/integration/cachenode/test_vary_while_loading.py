"""A response that varies is found after a restart before the background
load reached it: the names it varies on are noted under its key's own
hashed path, and the request's values of them give its variant's
(cachenode/store/loading.py)."""

from __future__ import annotations

import os
import time

from cachenode.http.vary import variant
from cachenode.store.disk import Store
from cachenode.store.layout import read_vary
from cachenode.store.objects import Meta

KEY = "http://www.cs.toronto.edu/datasets/train.jsonl"
BODIES = {"gzip": b"zipped" * 50, "identity": b"plain" * 70}


async def put(store: Store, coding: str, *, vary: tuple[str, ...] = ("accept-encoding",)) -> Meta:
    temp = await store.new_temp()
    os.close(temp.read_fd)
    await store.write(temp, BODIES[coding])
    now = time.time()
    return await store.commit(temp, Meta(key=KEY, url=KEY, host="www.cs.toronto.edu", size=0, headers=(),
                                         stored_at=now, expires_at=now + 600, vary=vary,
                                         variant=variant(vary, {"Accept-Encoding": coding})))


def read(store: Store, meta: Meta) -> bytes:
    with open(store.data_path(meta), "rb") as f:
        return f.read(meta.size)


async def test_each_variant_is_a_hit_right_after_a_restart_before_the_scan_reached_it(tmp_path):
    store = Store(tmp_path)
    await store.open()
    for coding in BODIES:
        await put(store, coding)
    await store.close()

    again = Store(tmp_path)
    await again.open(background=True)
    assert again.load_progress < 1.0  # nothing scanned yet: only the hashed paths can answer
    for coding, body in BODIES.items():
        meta = again.lookup(KEY, {"Accept-Encoding": coding})
        assert meta is not None and meta.variant == f"accept-encoding={coding}" and read(again, meta) == body, \
            coding
    assert again.lookup(KEY, {"Accept-Encoding": "br"}) is None  # not stored: not another's
    assert again.lookup(KEY) is None  # who does not say what it asks for gets no variant
    await again.loaded()
    assert len(again) == 2
    await again.close()


async def test_the_note_goes_with_the_keys_last_variant_and_when_a_response_no_longer_varies(tmp_path):
    store = Store(tmp_path)
    await store.open()
    await put(store, "gzip")
    await store.idle()
    assert read_vary(store.objects, KEY) == ("accept-encoding",)
    await store.remove(KEY)
    await store.idle()
    assert read_vary(store.objects, KEY) is None
    await put(store, "gzip")
    await put(store, "identity", vary=())  # the newest response does not vary: the variants go
    await store.idle()
    assert read_vary(store.objects, KEY) is None and [m.vary for m in store.metas()] == [()]
    await store.close()


async def restarted(tmp_path) -> Store:
    """A store of both variants, opened again with its index loading in the background, nothing scanned yet."""
    store = Store(tmp_path)
    await store.open()
    for coding in BODIES:
        await put(store, coding)
    await store.close()
    again = Store(tmp_path)
    await again.open(background=True)
    assert again.load_progress < 1.0
    return again


def files(store: Store) -> list[str]:
    return sorted(p.name for p in store.objects.rglob("*") if p.is_file())


async def test_a_key_removed_while_the_index_loads_does_not_come_back_with_variants_not_scanned_yet(tmp_path):
    store = await restarted(tmp_path)
    await store.remove(KEY)
    await store.loaded()
    await store.idle()
    assert KEY not in store and store.metas() == [] and store.lookup(KEY, {"Accept-Encoding": "gzip"}) is None
    assert files(store) == [], "the stale variants' files and the note went"
    await store.close()


async def test_a_response_varying_on_other_names_committed_while_loading_keeps_old_variants_out(tmp_path):
    store = await restarted(tmp_path)
    newest = await put(store, "gzip", vary=("accept-encoding", "accept-language"))
    await store.loaded()
    await store.idle()
    assert [m.data for m in store.metas()] == [newest.data]
    assert store.index.vary_of(KEY) == ("accept-encoding", "accept-language")
    assert store.lookup(KEY, {"Accept-Encoding": "gzip"}) is not None
    await store.close()


async def test_the_store_itself_says_whether_a_key_varies_and_on_what(tmp_path):
    """`Store.varies`/`vary_of` answer from its index (they read attributes only the index has, and raised)."""
    store = Store(tmp_path)
    await store.open()
    assert (store.varies(KEY), store.vary_of(KEY)) == (False, None)
    await put(store, "gzip")
    assert (store.varies(KEY), store.vary_of(KEY)) == (True, ("accept-encoding",))
    await store.close()
