"""Loading the index in the background, as nginx's cache loader does: a node
with millions of objects serves at once after a restart.

The start-up scan reads every `.meta`, which for a million objects takes
minutes. So the node starts serving before it is done: the loader scans
one `objects/<2 hex>` folder at a time in the executor and adds what it
found to the index between folders, `SLICE` objects between two turns of
the event loop. Meanwhile:

- a lookup of a key whose folder is not scanned yet reads that key's own
  files (`layout.find`), blocking reads of a few small files on the event
  loop, and only until the scan reaches the folder: its meta from its
  hashed path, its small objects' files by the names a listing of the
  folder gives (random nonces: no path to hash). The folder is listed once,
  at its first such lookup (3.2 ms at 3,906 files), and the listing kept
  as two integers a file (cachenode/store/listing.py) until the scan gets
  there, not listed again at each lookup (2.6 ms each at 3,906 files);
  a response that varies is stored under its variant's own hashed path:
  the names it varies on, noted under the key's (`layout.read_vary`), and
  the request's values of them give that path;
- a commit or a removal of such a key loads it first, so the index knows
  the files it replaces or deletes;
- eviction works on what is loaded; once everything is, the store evicts
  down to its capacity;
- what the node drops while loading (an eviction, a removal) is not added
  back by a scan that read its meta before it went; nor is what the scan
  finds of a key removed meanwhile (its variants in folders not scanned
  yet), or a response older than the key's stored one that varies on
  other names (the newest response says how a key varies): their files go.

`progress` (folders scanned / folders) is on /readyz, in /metrics
(`nezha_store_loaded_ratio`) and in `nezha stats`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

import structlog

from cachenode.store.index import Index
from cachenode.http.vary import variant
from cachenode.store.layout import clear_tmp, find, folders, list_sealed, read_vary, scan_folder
from cachenode.store.listing import SealedListing
from cachenode.store.objects import VARIANT_SEPARATOR, Meta
from nezha.keys import object_id

log = structlog.get_logger("nezha.store")

# A folder's objects added to the index between two turns of the event loop, at most: a folder
# holds a 256th of the store (3,906 objects at a million), and adding them all in a row held the
# loop about 44 ms; 512 adds take about 6 ms. A lookup, commit or removal that runs in between
# is seen by the checks each add makes first (held, dropped, removed: `_stale`).
SLICE = 512


class Loader:
    def __init__(self, *, objects: Path, tmp: Path, index: Index, done: Callable[[], None],
                 discard: Callable[[Meta], object]) -> None:
        self._objects = objects
        self._tmp = tmp
        self._index = index
        self._done = done
        self._discard = discard  # a stale object the scan found: its files go
        self._removed: set[str] = set()  # keys removed while loading
        self._pending: set[str] = set()  # folder names (2 hex) not scanned yet
        self._listings: dict[str, SealedListing] = {}  # of those, the ones looked up: their sealed files
        self._total = 0
        self._task: asyncio.Task | None = None
        self.loading = False

    @property
    def progress(self) -> float:
        """Folders scanned / folders (1.0 when nothing is left to load)."""
        return 1.0 if not self._total else 1 - len(self._pending) / self._total

    async def start(self) -> None:
        """Empty tmp/, list the folders, and start scanning them; returns at once after that."""
        loop = asyncio.get_running_loop()

        def prepare() -> tuple[int, list[Path]]:
            return clear_tmp(self._objects, self._tmp), folders(self._objects)

        removed, subs = await loop.run_in_executor(None, prepare)
        self._pending = {sub.name for sub in subs}
        self._total = len(subs)
        self.loading = True
        self._index.dropped = set()
        self._index.loaded = self.progress
        self._task = loop.create_task(self._run(subs, removed))

    async def _run(self, subs: list[Path], removed: int) -> None:
        loop = asyncio.get_running_loop()
        started = time.time()
        objects = 0
        try:
            for sub in subs:
                metas, gone = await loop.run_in_executor(None, lambda sub=sub: scan_folder(
                    sub, orphans_before=started))
                removed += gone
                index = self._index
                for n, meta in enumerate(sorted(metas, key=lambda m: m.stored_at), 1):
                    if n % SLICE == 0:
                        await asyncio.sleep(0)  # the requests waiting meanwhile (each check below is made after)
                    if index.has(meta.slot) or index.was_dropped(meta.slot):
                        continue
                    if self._stale(meta):
                        self._discard(meta)
                        removed += 1
                        continue
                    index.add(meta, recent=False)
                    objects += 1
                self._pending.discard(sub.name)
                self._listings.pop(sub.name, None)
                self._index.loaded = self.progress
        finally:
            self.loading = False
            self._index.dropped = None
            self._removed.clear()
            self._listings.clear()
        log.info("store_opened", root=str(self._objects.parent), objects=objects, removed=removed,
                 seconds=round(time.time() - started, 3))
        self._done()

    def removed(self, key: str) -> None:
        """Every response of `key` was removed: what the scan finds of it later is stale."""
        if self.loading:
            self._removed.add(key)

    def _stale(self, meta: Meta) -> bool:
        """Whether a scanned object is older than what the node did since it started."""
        if meta.key in self._removed:
            return True
        index = self._index
        if not meta.vary and not index.varies(meta.key):
            return False  # the common case, from memory: its own slot is not held (checked before)
        held = (index.get(slot) for slot in index.slots_of(meta.key))
        return any(m is not None and m.vary != meta.vary and m.stored_at >= meta.stored_at for m in held)

    def load(self, key: str, request_headers=None) -> Meta | None:
        """The object stored under `key` (its slot without a variant; with
        `request_headers`, else the variant they select) if its folder is not
        scanned yet: read from its files and added to the index now. None once
        scanned: the index alone says."""
        if not self.loading:
            return None
        meta = self._load_slot(key)
        if meta is not None or request_headers is None:
            return meta
        names = self._index.vary_of(key) or read_vary(self._objects, key)
        if not names:
            return None
        return self._load_slot(f"{key}{VARIANT_SEPARATOR}{variant(names, request_headers)}")

    def _load_slot(self, slot: str) -> Meta | None:
        oid = object_id(slot)
        name = oid[:2]
        if name not in self._pending:
            return None
        if self._index.has(slot):
            return self._index.get(slot)
        listing = self._listings.get(name)
        if listing is None:  # its first lookup: listed once, not at every lookup (store/listing.py)
            listing = self._listings[name] = list_sealed(self._objects / name)
        meta = find(self._objects, slot, listing.names(oid))
        if meta is not None and not self._index.was_dropped(slot):
            self._index.add(meta)
            return meta
        return None

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
