"""A lookup before the start-up scan reached a key's folder (cachenode/store/loading.py)
finds the key's small objects through one listing of the folder, kept compact
(cachenode/store/listing.py): the same object the glob of the whole folder
at every lookup found, and the folder listed once, however many files it holds."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from cachenode.store import loading, small
from cachenode.store.index import Index
from cachenode.store.layout import find, list_sealed, place, read_meta
from cachenode.store.listing import SealedListing
from cachenode.store.loading import Loader
from cachenode.store.objects import Meta, slot_of
from cachenode.store.record_json import record_of
from cachenode.store.sealed import seal
from nezha.keys import object_id
from tests.support_folders import HOST, keys_in


def meta_of(key: str, at: float) -> Meta:
    return Meta(key=key, url=key, host=HOST, size=0, headers=(("ETag", f'"{at}"'),), stored_at=at,
                expires_at=at + 3600)


def write_sealed(objects: Path, meta: Meta, body: bytes, *, name: str | None = None, slot_of: str | None = None,
                 cut: int | None = None, flip: bool = False) -> str:
    """A sealed file as a commit leaves it (`name`: another than a commit would choose; `slot_of`:
    under another key's id), or torn (`cut` bytes short) or damaged (a byte flipped)."""
    oid = object_id(slot_of or meta.slot)
    name = name or f"{oid}.{random.getrandbits(48):012x}{small.SUFFIX}"
    raw = bytearray(body + seal(body, {**record_of(meta), "size": len(body), "data": name}))
    if flip:
        raw[len(raw) // 3] ^= 0x40
    if cut:
        del raw[-cut:]
    folder = objects / oid[:2]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(raw)
    return name


def glob_find(objects: Path, slot: str, *, unlisted: frozenset[str] = frozenset()) -> Meta | None:
    """`layout.find` as it was before the listing: a glob of the whole folder at every lookup
    (the files in `unlisted`, written after the listing, passed over)."""
    oid = object_id(slot)
    folder = objects / oid[:2]
    found = []
    meta = read_meta(folder / f"{oid}.meta")
    if meta is not None and meta.slot == slot:
        try:
            if (folder / meta.data).stat().st_size == meta.size:
                found.append(meta)
        except OSError:
            pass
    for opath in folder.glob(f"{oid}.*{small.SUFFIX}"):
        if opath.name in unlisted:
            continue
        sealed = small.read_sealed(opath)
        if sealed is not None and sealed.slot == slot:
            found.append(sealed)
    return max(found, key=lambda m: m.stored_at, default=None)


def fill(objects: Path, keys: list[str], rng: random.Random) -> None:
    """Each key one of the ways a folder holds an object, or fails to."""
    for i, key in enumerate(keys):
        body = rng.randbytes(rng.randint(1, 300))
        at = 1000.0 + i
        way = rng.randrange(12)
        if way == 0:
            continue  # nothing stored
        if way in (1, 2, 3):
            write_sealed(objects, meta_of(key, at), body)
        if way == 2:  # two sealed files (a crash between a commit and its unlink): the newer
            write_sealed(objects, meta_of(key, at + rng.choice((-500, 500))), body[::-1])
        if way == 3:  # and a torn or damaged newer one: never returned
            write_sealed(objects, meta_of(key, at + 500), body, cut=rng.randint(1, 40), flip=rng.random() < .5)
        if way == 4:
            write_sealed(objects, meta_of(key, at), body, cut=rng.randint(1, len(body) + 16))
        if way in (5, 6):  # a large object's .meta and .data
            place(objects, meta_of(key, at), body)
        if way == 6:  # and a sealed file beside it, newer or older
            write_sealed(objects, meta_of(key, at + rng.choice((-500, 500))), body)
        if way == 7:  # a .meta whose .data is short: incomplete
            placed = place(objects, meta_of(key, at), body)
            (objects / object_id(key)[:2] / placed.data).write_bytes(body[:-1])
        if way == 8:  # a name the store does not write: the glob found it, so must the listing
            oid = object_id(key)
            write_sealed(objects, meta_of(key, at), body, name=f"{oid}.{rng.getrandbits(48):012X}{small.SUFFIX}")
            write_sealed(objects, meta_of(key, at - 1), body, name=f"{oid}.x{small.SUFFIX}")
        if way == 9:  # under this key's id, another key's record: not this key's object
            write_sealed(objects, meta_of(f"{HOST}/other/{i}", at), body, slot_of=key)
        if way == 10:  # a variant of it, under an id of its own
            meta = replace(meta_of(key, at), vary=("accept-encoding",), variant="accept-encoding=gzip")
            write_sealed(objects, meta, body)
        if way == 11:
            write_sealed(objects, meta_of(key, at), body, flip=True)


@pytest.mark.parametrize("seed", range(3))
def test_a_lookup_through_the_listing_finds_what_a_glob_of_the_folder_found(tmp_path, seed):
    rng = random.Random(seed)
    random.seed(seed)  # the nonces of write_sealed
    objects = tmp_path / "objects"
    keys = keys_in("00", 600)
    stored, absent = keys[:500], keys[500:]
    fill(objects, stored, rng)
    variants = [slot_of(k, vary=("accept-encoding",), variant="accept-encoding=gzip") for k in stored]
    slots = stored + absent + variants  # a variant lives under an id, and in a folder, of its own
    listings = {sub.name: list_sealed(sub) for sub in objects.iterdir()}

    def names(slot: str) -> list[str]:
        oid = object_id(slot)
        return listings[oid[:2]].names(oid) if oid[:2] in listings else []

    found = 0
    for slot in slots:
        want = glob_find(objects, slot)
        assert find(objects, slot, names(slot)) == want, slot
        found += want is not None
    assert found > 200  # the folders held what they were meant to
    folder = objects / "00"
    assert len(listings["00"]) == sum(n.endswith(small.SUFFIX) for n in os.listdir(folder))

    # After the listing: files deleted (an eviction, the scan's own deletions) and files written
    # (a commit, which loaded the key into the index first: the index answers for it, not the listing).
    files = sorted(f for sub in objects.iterdir() for f in sub.iterdir())
    for path in rng.sample(files, len(files) // 5):
        path.unlink()
    added = set()
    for key in rng.sample(stored + absent, 150):
        added.add(write_sealed(objects, meta_of(key, 5000.0), b"new"))
    for slot in slots:
        want = glob_find(objects, slot, unlisted=frozenset(added))
        assert find(objects, slot, names(slot)) == want, slot

def test_the_listing_keeps_16_bytes_for_each_file_the_store_writes():
    names = [small.sealed_meta(10, key=key, url=key, host=HOST, headers=(), stored_at=1.0, expires_at=2.0).data
             for key in keys_in("ab", 300)]
    names += ["x.meta", "y.0123456789ab.data", "z.vary"]  # not sealed files: not kept
    listing = SealedListing(names)
    assert len(listing) == 300 and listing.nbytes == 16 * 300  # none kept as a name
    for name in names[:300]:
        assert listing.names(name[:64]) == [name]


def test_names_of_another_form_are_matched_as_the_glob_matched_them(tmp_path):
    oid, other = object_id("k"), object_id("j")
    names = [f"{oid}.ABCDEF012345.obj", f"{oid}..obj", f"{oid}.obj", f"{oid}.1.2.obj", f"{oid}x0123456789ab.obj",
             f"{oid}.0123456789ab.obj", f"{oid}.0123 456789a.obj", f"{oid}.0123456789ab.obj.x", f"{oid}.\n.obj",
             f"{other}.0123456789ab.obj", f"{oid[:63]}A.0123456789ab.obj", f"{oid.upper()}.0123456789ab.obj"]
    for name in names:
        (tmp_path / name).touch()
    listing = SealedListing(os.listdir(tmp_path))
    for id_ in (oid, other):
        found = listing.names(id_)
        assert len(set(found)) == len(found)
        assert sorted(n for n in found if (tmp_path / n).exists()) == sorted(p.name for p in tmp_path.glob(f"{id_}.*.obj"))


@pytest.mark.parametrize("n", [40, 400])
async def test_lookups_into_a_folder_not_scanned_yet_list_it_once_and_open_only_the_keys_files(tmp_path, monkeypatch,
                                                                                               n):
    objects = tmp_path / "objects"
    keys = keys_in("00", n + 20)
    stored, absent = keys[:n], keys[n:]
    for i, key in enumerate(stored):
        write_sealed(objects, meta_of(key, 1000.0 + i), b"body")
    folder = os.path.realpath(objects / "00")
    listed, opened = [], []
    for name in ("listdir", "scandir"):
        def counted(path=".", *, real=getattr(os, name), name=name):
            if os.path.realpath(os.fspath(path)) == folder:
                listed.append(name)
            return real(path)
        monkeypatch.setattr(os, name, counted)
    read_sealed = small.read_sealed
    monkeypatch.setattr(small, "read_sealed", lambda path: opened.append(path) or read_sealed(path))
    go = threading.Event()  # the scan waits: every folder stays not scanned
    scan_folder = loading.scan_folder
    monkeypatch.setattr(loading, "scan_folder", lambda sub, **kw: go.wait(10) and scan_folder(sub, **kw))

    index = Index(evicted=lambda meta, reason: None)
    loader = Loader(objects=objects, tmp=tmp_path / "tmp", index=index, done=lambda: None, discard=lambda m: None)
    await loader.start()
    try:
        for key in absent:
            assert loader.load(key, {"Accept-Encoding": "gzip"}) is None
        assert opened == []
        for i, key in enumerate(stored):
            meta = loader.load(key)
            assert meta is not None and meta.stored_at == 1000.0 + i
        assert len(opened) == n  # its own file, once: not a file more for a larger folder
        assert listed == ["listdir"]  # once, at the first lookup: not at each
    finally:
        go.set()
        await asyncio.wait_for(loader.wait(), 30)
    assert len(index) == n
