"""A restarted store answers for a folder its start-up scan has not reached
through one listing of the folder (cachenode/store/loading.py,
cachenode/store/listing.py): what changes in the folder after that listing
(a key stored, replaced, removed) is answered as the store did it, before
the scan gets there and after."""

from __future__ import annotations

import threading
import time

from cachenode.store import loading
from cachenode.store.disk import Store
from tests.support_folders import keys_in, put, read


async def test_a_folder_listed_before_it_changed_answers_as_the_store_changed_it(tmp_path, monkeypatch):
    keys = keys_in("00", 30)
    store = Store(tmp_path)
    await store.open()
    at = time.time()
    for i, key in enumerate(keys[:20]):
        put(store, key, b"old %d" % i, at)
    await store.idle()
    await store.close()

    go = threading.Event()  # the scan waits until the changes are made and looked up
    scan_folder = loading.scan_folder
    monkeypatch.setattr(loading, "scan_folder", lambda sub, **kw: go.wait(30) and scan_folder(sub, **kw))
    again = Store(tmp_path)
    await again.open(background=True)
    try:
        assert read(again, keys[0]) == b"old 0"  # the folder's first lookup: listed now
        put(again, keys[25], b"new", at + 1)  # written after the listing
        put(again, keys[1], b"replaced", at + 1)
        assert [m.key for m in await again.remove(keys[2])] == [keys[2]]
        await again.idle()
        want = {keys[0]: b"old 0", keys[1]: b"replaced", keys[2]: None, keys[3]: b"old 3", keys[25]: b"new",
                keys[26]: None}
        assert again.loading and {key: read(again, key) for key in want} == want
    finally:
        go.set()
    await again.loaded()
    assert {key: read(again, key) for key in want} == want
    assert len(again) == 20 and keys[2] not in again
    await again.close()
