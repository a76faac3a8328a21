"""A small body whole in memory stored in one go (`SealedWrites.put_sealed`): one
file created under its final name, one write, no temp file and no rename,
nothing left when the disk refuses it. What keeps it crash-safe is the seal:
a crash (`kill -9` between the create and the write, a power loss before the
group sync) can leave its file short, empty or zero-filled under that name; such
a file is never served after a restart, whether the scan or a lookup before
it finds it, and the object it would have replaced is served instead
(docs/cache-node.md, "Small objects")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cachenode.store import small
from cachenode.store.disk import Store
from tests.integration.cachenode.conftest import key_of

HOST = "images.example"
PATH = "/train/n01440764/n01440764_10026.JPEG"
OLD, NEW = os.urandom(20_000), os.urandom(20_000)


def record(key: str, *, at: float) -> dict:
    return dict(key=key, url=key, host=HOST, headers=(("ETag", '"v"'),), stored_at=at, expires_at=at + 3600)


async def opened(root: Path, *, background: bool) -> Store:
    store = Store(root)
    await store.open(background=background)
    return store


def torn(kind: str, whole: bytes) -> bytes:
    """What a crash can leave of a file written in one go and never synced."""
    return {"short": whole[:len(whole) // 2], "empty": b"",
            "zeroed": whole[:4096] + bytes(len(whole) - 4096)}[kind]


def objects_in(store: Store) -> list[Path]:
    return sorted(store.objects.rglob(f"*{small.SUFFIX}"))


async def replaced_beside(root: Path, key: str, *, keep: str) -> tuple:
    """The old object stored in `root`, and its replacement's file as `put_sealed` writes it (made in another
    folder) left beside it under its own name, `keep` of it: its file was created, the unlink of the old one
    and maybe the new one's pages did not happen (a crash before the group sync). The old Meta, the new one, its path."""
    now = time.time()
    store = await opened(root / "store", background=False)
    old = store.put_sealed(OLD, **record(key, at=now))
    await store.close()
    elsewhere = await opened(root / "elsewhere", background=False)
    new = elsewhere.put_sealed(NEW, **record(key, at=now + 1))
    whole = Path(elsewhere.data_path(new)).read_bytes()
    await elsewhere.close()
    beside = Path(store.data_path(old)).parent / new.data
    beside.write_bytes(whole if keep == "whole" else torn(keep, whole))
    return old, new, beside


async def test_a_small_cold_fill_is_one_file_created_under_its_final_name_and_one_write(
        origin, make_node, session, monkeypatch):
    origin.put(PATH, NEW, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    calls: list[tuple] = []
    real_rename, real_open, real_pwrite = os.rename, os.open, os.pwrite
    monkeypatch.setattr(os, "rename", lambda a, b: (calls.append(("rename", str(a), str(b))), real_rename(a, b))[1])
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (calls.append(("open", str(p))), real_open(p, *a, **k))[1])
    monkeypatch.setattr(os, "pwrite", lambda fd, d, at: (calls.append(("pwrite", len(d))), real_pwrite(fd, d, at))[1])
    status, headers, body = await node.get(session, PATH)
    assert (status, headers["X-Nezha-Cache"], body) == (200, "miss", NEW)
    store = node.node.store
    meta = store.lookup(key_of(PATH))
    assert meta is not None and small.is_sealed(meta)
    assert calls == [("open", store.data_path(meta)), ("pwrite", os.path.getsize(store.data_path(meta)))]
    assert list(store.tmp.iterdir()) == []
    with open(store.data_path(meta), "rb") as f:
        assert f.read(len(NEW)) == NEW and small.check(f.fileno(), meta)


async def test_a_small_body_the_disk_refuses_leaves_no_file_behind(origin, make_node, session, monkeypatch):
    origin.put(PATH, NEW, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    real_pwrite = os.pwrite

    def full(fd, data, offset):
        real_pwrite(fd, bytes(data)[:100], offset)  # part of it went, as on a disk filling up
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(os, "pwrite", full)
    status, headers, body = await node.get(session, PATH)
    await node.node.settled()
    assert (status, body) == (200, NEW)
    store = node.node.store
    assert key_of(PATH) not in store and objects_in(store) == [] and list(store.tmp.iterdir()) == []


@pytest.mark.parametrize("background", [False, True], ids=["scanned", "looked-up-before-the-scan"])
@pytest.mark.parametrize("kind", ["short", "empty", "zeroed"])
async def test_a_torn_new_small_object_is_never_served_after_a_restart_and_its_file_goes(tmp_path, kind,
                                                                                           background):
    key = f"http://{HOST}{PATH}"
    store = await opened(tmp_path / "store", background=False)
    meta = store.put_sealed(NEW, **record(key, at=time.time()))
    await store.close()
    path = Path(store.data_path(meta))
    path.write_bytes(torn(kind, path.read_bytes()))  # what a crash before the group sync left

    again = await opened(tmp_path / "store", background=background)
    assert again.lookup(key) is None
    await again.idle()
    if background:
        await again._loader.wait()
    assert again.lookup(key) is None and not path.exists()
    await again.close()


@pytest.mark.parametrize("background", [False, True], ids=["scanned", "looked-up-before-the-scan"])
@pytest.mark.parametrize("kind", ["short", "empty", "zeroed"])
async def test_a_torn_replacement_leaves_the_old_small_object_served_after_a_restart(tmp_path, kind, background):
    key = f"http://{HOST}{PATH}"
    old, _, beside = await replaced_beside(tmp_path, key, keep=kind)

    again = await opened(tmp_path / "store", background=background)
    got = again.lookup(key)
    assert got is not None and got.data == old.data
    with open(again.data_path(got), "rb") as f:
        assert f.read(len(OLD)) == OLD and small.check(f.fileno(), got)
    if background:
        await again._loader.wait()
    assert again.lookup(key).data == old.data and not beside.exists()
    await again.close()


async def test_a_whole_replacement_a_crash_left_beside_the_old_object_is_the_one_served(tmp_path):
    key = f"http://{HOST}{PATH}"
    old, new, _ = await replaced_beside(tmp_path, key, keep="whole")

    again = await opened(tmp_path / "store", background=False)
    got = again.lookup(key)
    assert got is not None and got.data == new.data
    with open(again.data_path(got), "rb") as f:
        assert f.read(len(NEW)) == NEW
    assert not Path(again.data_path(old)).exists()
    await again.close()
