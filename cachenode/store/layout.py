"""The store's files on disk: reading and writing an object's `.meta`, and the
start-up scan that finds what a data directory holds.

Layout under the data directory:

    objects/<2 hex>/<id>.meta            JSON: key, URL, headers, size, expiry, data file
    objects/<2 hex>/<id>.<nonce>.data    the bytes
    objects/<2 hex>/<id>.<nonce>.obj     a small object: bytes, record and seal in one file
                                         (cachenode/store/small.py, sealed.py)
    tmp/                                 fills in progress; emptied at start-up

Apart from the store's steps (`store/disk.py`) so that the format of the
files is in one place: what the scan trusts is exactly what a write produces.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from cachenode.store.objects import Meta
from nezha.keys import object_id


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


def scan(objects: Path, tmp: Path, *,
         sealed: Callable[[Path], Meta | None] = lambda _: None) -> tuple[list[Meta], int]:
    """Every complete object under `objects`, and how many files were deleted:
    everything in `tmp`, metas that cannot be read or whose data file is
    missing or of the wrong size, data files no meta names, and small
    objects' `.obj` files that `sealed` does not find whole. Of two objects
    in one slot (a crash between a commit and the unlink of what it
    replaced), the newer stays."""
    objects.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    removed = 0
    for leftover in tmp.iterdir():
        if leftover.is_file():
            leftover.unlink(missing_ok=True)
            removed += 1
    metas: list[Meta] = []
    for sub in objects.iterdir():
        if not sub.is_dir():
            continue
        wanted: set[str] = set()
        for opath in sub.glob("*.obj"):
            meta = sealed(opath)
            if meta is None or object_id(meta.slot) != opath.name.split(".", 1)[0]:
                continue  # deleted below, as no meta names it
            wanted.add(meta.data)
            metas.append(meta)
        for mpath in sub.glob("*.meta"):
            meta = read_meta(mpath)
            if meta is None or object_id(meta.slot) != mpath.stem:
                mpath.unlink(missing_ok=True)
                removed += 1
                continue
            dpath = sub / meta.data
            try:
                ok = dpath.stat().st_size == meta.size
            except OSError:
                ok = False
            if not ok:
                mpath.unlink(missing_ok=True)
                removed += 1
                continue
            wanted.add(meta.data)
            metas.append(meta)
        for f in sub.iterdir():
            if f.suffix != ".meta" and f.name not in wanted:
                f.unlink(missing_ok=True)
                removed += 1
    newest: dict[str, Meta] = {}
    for meta in metas:
        held = newest.get(meta.slot)
        if held is None or meta.stored_at > held.stored_at:
            newest[meta.slot] = meta
    for meta in metas:
        if newest[meta.slot] is not meta:
            oid = object_id(meta.slot)
            (objects / oid[:2] / meta.data).unlink(missing_ok=True)
            if not meta.data.endswith(".obj"):
                (objects / oid[:2] / f"{oid}.meta").unlink(missing_ok=True)
            removed += 1
    return list(newest.values()), removed
