"""A store's objects placed in one folder on purpose, for tests of what a
restarted store does folder by folder (cachenode/store/loading.py,
cachenode/store/listing.py): keys whose objects share `objects/<2 hex>`,
a small object put as a fill stores it, and its bytes read back."""

from __future__ import annotations

from cachenode.store.disk import Store
from nezha.keys import object_id

HOST = "images.example"


def keys_in(folder: str, n: int, *, tag: str = "train") -> list[str]:
    """`n` keys whose objects all live in `objects/<folder>`."""
    found, i = [], 0
    while len(found) < n:
        key = f"{HOST}/{tag}/{i}.JPEG"
        i += 1
        if object_id(key)[:2] == folder:
            found.append(key)
    return found


def put(store: Store, key: str, body: bytes, at: float):
    """`body` stored at once as `key`'s object, stored at `at` (its ETag names `at`)."""
    return store.put_sealed(body, key=key, url=key, host=HOST, headers=(("ETag", f'"{at}"'),), stored_at=at,
                            expires_at=at + 3600, status=200)


def read(store: Store, key: str) -> bytes | None:
    """The body the store holds for `key`, or None."""
    meta = store.lookup(key)
    if meta is None:
        return None
    with open(store.data_path(meta), "rb") as f:
        return f.read(meta.size)
