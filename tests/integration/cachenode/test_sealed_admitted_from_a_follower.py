"""A sealed file a follower wrote on a lead (cachenode/workers/follower_leads.py),
admitted by the primary's store (`SealedWrites.admit_sealed`): kept whole, and
its file never taken for the old copy of itself.

A restarted node serves while its start-up scan loads the index in the
background; admitting a key whose folder is not scanned yet loads that slot
first, which finds the file the follower has just written. Before, the store
then admitted the record over the entry the load made of the same file, and
unlinked that file as the copy it replaced: the index named a missing file."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cachenode.store.disk import Store
from cachenode.store.small import sealed_meta
from nezha.keys import object_id

HOST = "images.example"
KEY = f"{HOST}/train/a.JPEG"


def record(at: float) -> dict:
    return dict(url=KEY, host=HOST, headers=(("ETag", '"v"'),), stored_at=at, expires_at=at + 3600, status=200)


async def test_a_followers_file_admitted_while_the_index_loads_is_kept(tmp_path):
    root = tmp_path / "store"
    (root / "objects" / object_id(KEY)[:2]).mkdir(parents=True)  # a store with objects: its folder pending
    store = Store(root)
    await store.open(background=True)  # as the node opens it
    follower = Store(root, writer=False)
    body = os.urandom(5000)
    meta = sealed_meta(len(body), key=KEY, **record(time.time()))
    follower.write_unadmitted(meta, body)
    path = Path(store.data_path(meta))
    stored = store.admit_sealed(meta)
    await store.idle()
    assert stored.data == meta.data and store.lookup(KEY) is not None and store.lookup(KEY).data == meta.data
    assert path.exists() and path.stat().st_size > len(body), "the admitted object's own file was unlinked"
    await store.loaded()
    assert store.lookup(KEY).data == meta.data and path.exists()
