"""The store's files on disk: reading and writing an object's `.meta`, and the
start-up scan that finds what a data directory holds.

Layout under the data directory:

    objects/<2 hex>/<id>.meta            JSON: key, URL, headers, size, expiry, data file
    objects/<2 hex>/<id>.<nonce>.data    the bytes
    objects/<2 hex>/<id>.<nonce>.obj     a small object: bytes, record and seal in one file
                                         (cachenode/store/small.py, sealed.py)
    objects/<2 hex>/<id>.vary            JSON list: the request fields a key's stored responses vary
                                         on, under the key's own id (its variants are stored under
                                         ids of their own): how a lookup finds them before the scan
    tmp/                                 fills in progress; emptied at start-up

Apart from the store's steps (`store/disk.py`) so that the format of the
files is in one place: what the scan trusts is exactly what a write produces.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, replace
from pathlib import Path
from typing import Iterable

from cachenode.store import small
from cachenode.store.listing import SealedListing
from cachenode.store.objects import Meta
from cachenode.store.sealed import TRAILER_SIZE, Unsealed, record_length, seal
from nezha.keys import object_id

VARY_SUFFIX = ".vary"  # a key's Vary names (see the layout above)


def read_meta(path: Path) -> Meta | None:
    """The meta in `path`; None when it cannot be read, is no meta, or names a data file elsewhere."""
    try:
        raw = json.loads(path.read_text())
        meta = Meta(**raw)
        if "/" in meta.data or not meta.data.endswith(".data"):
            return None
        return meta
    except (OSError, ValueError, TypeError):
        return None


def write_meta(meta_path: Path, meta: Meta, *, tmp: Path) -> None:
    """Write `meta` to `meta_path` durably: a temp file in `tmp`, fsynced, renamed into place."""
    tmp_path = tmp / f"{secrets.token_hex(12)}.meta"
    try:
        with open(tmp_path, "w") as f:
            json.dump(asdict(meta), f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp_path, meta_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def place(objects: Path, meta: Meta, body: bytes) -> Meta:
    """Store `body` as `meta` the way a commit leaves it, without temp files
    or fsync: a store's files built in bulk (tests and benchmarks of a large
    store), never a node's own writes."""
    oid = object_id(meta.slot)
    folder = objects / oid[:2]
    folder.mkdir(parents=True, exist_ok=True)
    meta = replace(meta, size=len(body), data=f"{oid}.{secrets.token_hex(6)}.data")
    (folder / meta.data).write_bytes(body)
    (folder / f"{oid}.meta").write_text(json.dumps(asdict(meta)))
    return meta


def place_small(objects: Path, objects_and_bodies: Iterable[tuple[Meta, bytes]]) -> int:
    """Store each body as its meta in one sealed file, as a small object's
    commit leaves it (cachenode/store/small.py), without temp files or sync:
    like `place`, for a store's files built in bulk (a million small objects
    in a benchmark), never a node's own writes. How many were written."""
    made: set[str] = set()
    n = 0
    for meta, body in objects_and_bodies:
        oid = object_id(meta.slot)
        folder = os.path.join(objects, oid[:2])
        if folder not in made:
            os.makedirs(folder, exist_ok=True)
            made.add(folder)
        data = f"{oid}.{secrets.token_hex(6)}{small.SUFFIX}"
        record = {**small.record_of(meta), "size": len(body), "data": data}  # `replace`'s fields, no new Meta
        fd = os.open(os.path.join(folder, data), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, body + seal(body, record))
        finally:
            os.close(fd)
        n += 1
    return n


def read_record(objects: Path, oid: str, data: str) -> Meta | None:
    """The record of the object whose data file is `data` in `oid`'s folder, for
    the index on a hit (cachenode/store/index.py): a small object's from the end
    of its sealed file (the seal itself is checked when the file is read to be
    served, `small.check`), a large one's `.meta`. None when there is none, or
    it is not whole enough to parse."""
    folder = os.path.join(objects, oid[:2])
    if not data.endswith(small.SUFFIX):
        return read_meta(Path(folder, f"{oid}.meta"))
    try:
        fd = os.open(os.path.join(folder, data), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        length = os.fstat(fd).st_size
        if length < TRAILER_SIZE:
            return None
        n = record_length(os.pread(fd, TRAILER_SIZE, length - TRAILER_SIZE))
        size = length - TRAILER_SIZE - n
        raw = os.pread(fd, n, size)
        meta = Meta(**json.loads(raw))
    except (OSError, Unsealed, ValueError, TypeError):
        return None
    finally:
        os.close(fd)
    return meta if meta.size == size and meta.data == data else None


def clear_tmp(objects: Path, tmp: Path) -> int:
    """Create the folders; delete what fills in progress left in `tmp` (a crash, a kill). How many files went."""
    objects.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    removed = 0
    for leftover in tmp.iterdir():
        if leftover.is_file():
            leftover.unlink(missing_ok=True)
            removed += 1
    return removed


def scan_folder(sub: Path, *, orphans_before: float | None = None) -> tuple[list[Meta], int]:
    """The complete objects of one `objects/<2 hex>` folder, and how many files
    were deleted: metas that cannot be read or whose data file is missing or
    of the wrong size, data files no meta names, small objects' `.obj` files
    whose seal does not check, and the older of two objects in one slot. With `orphans_before`
    (a scan while the node already writes), a data file no meta names is
    deleted only if it was last written before then: a commit running now
    renames its data file into place before it writes the meta."""
    metas: list[Meta] = []
    removed = 0
    wanted: set[str] = set()
    for opath in sub.glob(f"*{small.SUFFIX}"):
        meta = small.read_sealed(opath)
        if meta is None or object_id(meta.slot) != opath.name.split(".", 1)[0]:
            continue  # deleted below, as nothing names it
        wanted.add(meta.data)
        metas.append(meta)
    for mpath in sub.glob("*.meta"):
        meta = read_meta(mpath)
        if meta is None or object_id(meta.slot) != mpath.stem:
            mpath.unlink(missing_ok=True)
            removed += 1
            continue
        try:
            ok = (sub / meta.data).stat().st_size == meta.size
        except OSError:
            ok = False
        if not ok:
            mpath.unlink(missing_ok=True)
            removed += 1
            continue
        wanted.add(meta.data)
        metas.append(meta)
    for f in sub.iterdir():
        if f.suffix not in (".meta", VARY_SUFFIX) and f.name not in wanted:
            if orphans_before is not None:
                try:
                    if f.stat().st_mtime >= orphans_before:
                        continue
                except OSError:
                    continue
            f.unlink(missing_ok=True)
            removed += 1
    kept, gone = _newest(sub, metas)
    return kept, removed + gone


def _newest(sub: Path, metas: list[Meta]) -> tuple[list[Meta], int]:
    """Of two objects in one slot (a crash between a commit and the unlink of
    what it replaced, a small object replacing a large one), the newer stays;
    the other's files are deleted. The objects and how many went."""
    newest: dict[str, Meta] = {}
    for meta in metas:
        held = newest.get(meta.slot)
        if held is None or meta.stored_at > held.stored_at:
            newest[meta.slot] = meta
    removed = 0
    for meta in metas:
        if newest[meta.slot] is not meta:
            (sub / meta.data).unlink(missing_ok=True)
            if not small.is_sealed(meta):
                (sub / f"{object_id(meta.slot)}.meta").unlink(missing_ok=True)
            removed += 1
    return list(newest.values()), removed


def folders(objects: Path) -> list[Path]:
    """The `objects/<2 hex>` folders, in name order."""
    return sorted(sub for sub in objects.iterdir() if sub.is_dir())


def vary_path(objects: Path, key: str) -> Path:
    oid = object_id(key)
    return objects / oid[:2] / f"{oid}{VARY_SUFFIX}"


def write_vary(objects: Path, key: str, names: tuple[str, ...], *, tmp: Path) -> None:
    """Note under `key`'s own id the fields its responses vary on (renamed into
    place, no fsync: one lost in a crash only means its variants are found
    once the start-up scan reaches them, as without it)."""
    path = vary_path(objects, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = tmp / f"{secrets.token_hex(12)}{VARY_SUFFIX}"
    try:
        tmp_path.write_text(json.dumps(list(names)))
        os.rename(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def read_vary(objects: Path, key: str) -> tuple[str, ...] | None:
    """The fields `key`'s responses vary on, as last noted; None when none is noted."""
    try:
        names = json.loads(vary_path(objects, key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return None
    return tuple(names)


def find(objects: Path, slot: str, sealed: Iterable[str]) -> Meta | None:
    """The object stored in `slot`, read from its files (a lookup before the
    start-up scan reached its folder); None if there is no complete one. Its
    `.meta` is read from its hashed path; `sealed` names its small objects'
    files (`SealedListing.names`), each checked whole; of two, the newer."""
    oid = object_id(slot)
    folder = objects / oid[:2]
    found: list[Meta] = []
    meta = read_meta(folder / f"{oid}.meta")
    if meta is not None and meta.slot == slot:
        try:
            if (folder / meta.data).stat().st_size == meta.size:
                found.append(meta)
        except OSError:
            pass
    for name in sealed:
        obj = small.read_sealed(folder / name)
        if obj is not None and obj.slot == slot:
            found.append(obj)
    return max(found, key=lambda m: m.stored_at, default=None)


def list_sealed(folder: Path) -> SealedListing:
    """The small objects' files in `folder` (none if it cannot be listed): what
    `find` is told of them until the start-up scan reaches the folder."""
    try:
        return SealedListing(os.listdir(folder))
    except OSError:
        return SealedListing(())


def scan(objects: Path, tmp: Path) -> tuple[list[Meta], int]:
    """Every complete object under `objects`, and how many files were deleted:
    everything in `tmp`, and what `scan_folder` deletes."""
    removed = clear_tmp(objects, tmp)
    metas: list[Meta] = []
    for sub in folders(objects):
        found, gone = scan_folder(sub)
        metas += found
        removed += gone
    return metas, removed
