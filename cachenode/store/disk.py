"""The node's disk: complete objects only, named by key hash.

Its files and their format: cachenode/store/layout.py. Objects leaving it
(evicted, lost, removed) and their files deleted: cachenode/store/removal.py.

A response that varies (`Vary`, RFC 9111 §4.1) is stored once per variant:
its slot in the index, and the name of its files, is its key plus the
canonical values of the request fields it varies on (cachenode/http/vary.py).
`lookup(key, request_headers)` finds the variant a request selects; the
names a key varies on are those of its most recently stored response.

A large object becomes servable only by the rename of its `.meta`, which
happens after its data file is complete, verified against the origin's
length, fsynced and renamed into place. A small one (at most `small_max`
bytes, cachenode/store/small.py) is one sealed file, renamed into place
(or, stored at once, written under its final name) without an fsync and made durable with others by a group sync
(cachenode/store/syncer.py); its checksum is checked at start-up and on
every read (`intact`). Either way a crash leaves the old object or no
object, never a partial one; start-up deletes orphans and torn files.

Every file name comes from the SHA-256 of the key, and every path is checked
to lie under the data directory, so no request can read or write elsewhere.
Blocking calls run in the default executor, one object's steps in the order
asked (cachenode/store/steps.py). What is stored, and what is evicted when
room is needed, is the in-memory index's to say (cachenode/store/index.py);
it is touched only from the event loop, so it needs no lock.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import structlog

from cachenode.counts import StoreSizes
from cachenode.http.headers import Pairs
from nezha.keys import object_id
from cachenode.store.index import Index, IndexView
from cachenode.store.integrity import Integrity
from cachenode.store.layout import read_record, scan, write_meta
from cachenode.store import blocks, small
from cachenode.store.loading import Loader
from cachenode.store import pins_file
from cachenode.store.pins import Pins
from cachenode.store.removal import Removal
from cachenode.store.objects import Meta, TempObject
from cachenode.store.steps import Steps
from cachenode.store.temps import TempFiles
from cachenode.store.small import SealedWrites
from cachenode.store.syncer import SYNC_INTERVAL, GroupSync
from cachenode.store.writing import ObjectWrite
from nezha.errors import StoreError

log = structlog.get_logger("nezha.store")


class Store(IndexView, TempFiles, SealedWrites, Integrity, Removal):
    def __init__(self, root: Path, *, capacity: int | None = None, clock: Callable[[], float] = time.time,
                 on_evict: Callable[[Meta], None] | None = None, hot_capacity: int | None = None,
                 pinned_capacity: int | None = None, extra: Callable[[str], bool] | None = None,
                 small_max: int = small.SMALL_MAX, sync_interval: float = SYNC_INTERVAL,
                 on_corrupt: Callable[[str], None] | None = None, verify_reads: bool = False,
                 writer: bool = True) -> None:
        self.root = Path(root).resolve()
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        self.capacity = capacity
        self.hot_capacity = hot_capacity  # bytes hot copies may hold; None: only `capacity` bounds them
        self._clock = clock
        self._on_evict = on_evict
        # Is an object of this key, about to be committed, an extra copy here (another node is its first
        # owner)? The ring view's answer (cachenode/cluster_view.py), a layer below.
        self._extra = extra
        # Told, by what found it ("copy", "read", "scrub"), of every object
        # whose bytes were not the ones its checksum names (nezha_corrupt_objects_total).
        self._on_corrupt = on_corrupt
        # False in a follower worker (cachenode/workers/): one process writes and deletes; the others read.
        self.writer = writer
        # Check a large object's blocks before any read sends them (`verify`).
        self.verify_reads = verify_reads
        # Workloads' prefetched objects, kept from eviction within `pinned_capacity` (store/pins.py),
        # saved in the data directory at every change and restored at start (store/pins_file.py).
        self.pins = Pins(capacity=pinned_capacity, size_of=self.stored_size, clock=clock, changed=self._pins_changed,
                         on_hold=lambda key, held: self._index.protect(key, held))
        self._pins_saving: asyncio.Task | None = None
        self._pins_dirty = False
        # The index keeps a compact row per object and reads the rest of its record from its file.
        self._index = Index(evicted=self._evicted, protected=self.pins.holds, named=self.pins.held,
                            ended=self.pins.expire,
                            records=functools.partial(read_record, self.objects), lost=self._lost)
        self._loader: Loader | None = None
        self._steps = Steps()
        self.small_max = small_max  # objects up to this size are sealed small files (cachenode/store/small.py)
        self.group_sync = GroupSync(self.root, interval=sync_interval)
        self._folders: dict[str, str] = {}  # object folders known to exist, by their 2 hex
        # The index's own watchers (what each is told: `Index.watchers`). A node's other
        # workers follow the index this way (cachenode/workers/), since only this process writes the store.
        self.watchers: list[Callable[[str, Meta], None]] = self._index.watchers

    # -- paths -------------------------------------------------------------
    def sizes(self) -> StoreSizes:
        """What the store's gauges show, handed to Counts by whoever changed the store (after
        every fill: `used_bytes` and `len(self)` read from the index directly, two calls fewer)."""
        index = self._index
        return StoreSizes(index.usage.stored, len(index), self.capacity)

    def _dir_of(self, oid: str) -> Path:
        return self.objects / oid[:2]

    def _folder(self, oid: str) -> str:
        """The folder of `oid`'s files, made if this process has not made or seen it yet (one mkdir per
        folder, not per commit)."""
        folder = self._folders.get(oid[:2])
        if folder is None:
            made = self._dir_of(oid)
            made.mkdir(parents=True, exist_ok=True)
            folder = self._folders[oid[:2]] = str(made)
        return folder

    def _inside(self, path: Path) -> Path:
        resolved = path.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise StoreError(f"refusing path {path}: outside data directory {self.root}")
        return resolved

    def data_path(self, meta: Meta) -> str:
        """Where a stored object's bytes are. Lexical, with no resolve() on the hit path:
        the folder is hex from SHA-256 and `meta.data` was checked to be a bare
        `*.data` name when the meta was read or written."""
        oid = object_id(meta.slot)
        return os.path.join(self.objects, oid[:2], meta.data)

    # -- start-up ----------------------------------------------------------
    async def open(self, *, background: bool = False) -> None:
        """Rebuild the index from disk; delete temporary and orphaned files.
        `background`: return as soon as tmp/ is emptied, the index loading
        while the node serves (cachenode/store/loading.py). The pins come
        back first, so the fit to capacity passes over what they hold."""
        saved = await asyncio.get_running_loop().run_in_executor(None, pins_file.load, self.root)
        if saved:
            log.info("pins_restored", objects=self.pins.restore(saved))
        if background:
            self._loader = Loader(objects=self.objects, tmp=self.tmp, index=self._index, done=self._fit,
                                  discard=lambda meta: self._unlink_later(meta, final=True))
            await self._loader.start()
            return
        metas, removed = await asyncio.get_running_loop().run_in_executor(None, scan, self.objects, self.tmp)
        for meta in sorted(metas, key=lambda m: m.stored_at):
            self._index.add(meta, recent=False)
        log.info("store_opened", root=str(self.root), objects=len(metas), bytes=self.used_bytes, removed=removed)
        self._fit()

    def _fit(self) -> None:
        """What was loaded, down to the capacity and the hot copies' share."""
        if self.hot_capacity is not None:
            self._index.evict_hot_to(self.hot_capacity)
        if self.capacity is not None:
            self._index.evict_to(self.capacity)

    @property
    def load_progress(self) -> float:
        """How far the start-up scan got: 1.0 once the index holds every stored object."""
        return self._index.loaded

    async def loaded(self) -> None:
        """Wait until the background start-up scan is done."""
        if self._loader is not None:
            await self._loader.wait()

    def _load(self, key: str) -> None:
        """While the scan runs: `key`'s object into the index now if its folder is not scanned yet."""
        if self._loader is not None and self._loader.loading:
            self._loader.load(key)

    # -- reads (the index: cachenode/store/index.py) --------------------------
    def lookup(self, key: str, request_headers=None) -> Meta | None:
        """The stored response for `key` that a request with `request_headers`
        selects (RFC 9111 §4.1). Without headers, only a response that does
        not vary: who does not say what it asks for gets no variant."""
        meta = self._index.lookup(key, request_headers)
        if meta is None and self._loader is not None and self._loader.loading and \
                self._loader.load(key, request_headers):
            meta = self._index.lookup(key, request_headers)
        return meta

    def stored_size(self, key: str) -> int | None:
        """As the index says (store/index_view.py), with `key`'s object loaded first if the
        start-up scan has not reached it: pins and prefetch checks ask right after a restart."""
        self._load(key)
        return IndexView.stored_size(self, key)

    # -- capacity ------------------------------------------------------------
    def fits(self, size: int) -> bool:
        return self.capacity is None or size <= self.capacity

    def reserve(self, size: int) -> None:
        """Make room for a fill of known size before its bytes arrive."""
        self._index.reserve(size)
        if self.capacity is not None:
            self._index.evict_to(self.capacity)

    def release(self, size: int) -> None:
        self._index.release(size)

    @property
    def loading(self) -> bool:
        """Whether the start-up scan still loads the index in the background (cachenode/store/loading.py)."""
        return self._loader is not None and self._loader.loading

    @property
    def index(self) -> Index:
        """The in-memory index: its usage by kind of copy, evictions by reason, census (cachenode/store/index.py)."""
        return self._index

    def _step(self, oid: str, fn: Callable[[], object]) -> asyncio.Future:
        """Run blocking `fn` after every earlier step on object `oid` (cachenode/store/steps.py)."""
        return self._steps.run(oid, fn)

    async def idle(self) -> None:
        """Wait until every disk step asked for so far (unlinks included) is done."""
        await self._steps.idle()

    async def close(self) -> None:
        """For a node that stops: a start-up scan still running stopped, its
        disk steps done, and the small objects it committed since the last
        group sync made durable."""
        if self._loader is not None:
            await self._loader.close()
        await self.idle()
        await self.group_sync.close()
        if self._pins_saving is not None:
            await self._pins_saving

    def _pins_changed(self) -> None:
        """The pins changed: saved off the loop, one write at a time, the last state written last."""
        self._pins_dirty = True
        if self._pins_saving is None or self._pins_saving.done():
            self._pins_saving = asyncio.get_running_loop().create_task(self._save_pins())

    async def _save_pins(self) -> None:
        while self._pins_dirty:
            self._pins_dirty = False
            try:
                await asyncio.get_running_loop().run_in_executor(None, pins_file.save, self.root,
                                                                 self.pins.snapshot())
            except OSError as e:  # the pins hold in memory all the same; the next change tries again
                log.warning("pins_not_saved", root=str(self.root), error=f"{type(e).__name__}: {e}")
                return

    # -- writes --------------------------------------------------------------
    def writing(self, *, reserve: int = 0, readable: bool = True, must_write: bool = False) -> ObjectWrite:
        """The one way to write an object: temp file, reserved room, commit or
        discard, owned by one object (cachenode/store/writing.py)."""
        return ObjectWrite(self, reserve=reserve, readable=readable, must_write=must_write)

    def corrupt(self, found_by: str) -> None:
        """Count an object found corrupt by `found_by` (it is logged where it was found)."""
        if self._on_corrupt is not None:
            self._on_corrupt(found_by)

    async def commit(self, temp: TempObject, meta: Meta, *, expect: str | None = None) -> Meta:
        """Make a finished temp file the servable object for `meta.key`.

        A large object gets the node's own block checksum (`Meta.blocks`,
        cachenode/store/blocks.py) from the file as written. `expect`: the
        summary of it its sender sent (a peer's copy): a copy whose bytes
        give another raises CorruptCopy and is not committed.

        Raises TooLarge, before touching the disk, for bytes beyond the
        capacity: such an object would evict everything else and still not fit.
        """
        sealed = temp.written <= self.small_max  # one sealed file (cachenode/store/small.py)
        meta = self.named(meta, temp.written, sealed=sealed)
        self.admission(meta, reserved=temp.reserved)  # TooLarge, Refused
        oid = object_id(meta.slot)
        if sealed:
            return self._admit(await self._commit_small(temp, meta), temp)
        folder = self._dir_of(oid)
        paths = (folder, self._inside(folder / meta.data), self._inside(folder / f"{oid}.meta"))
        temp.committing = self._step(oid, functools.partial(self._commit_large, temp, meta, expect, *paths))
        try:
            meta = await asyncio.shield(temp.committing)
        except CorruptCopy as e:
            log.error("corrupt_copy", key=meta.key, error=str(e))
            self.corrupt("copy")
            raise
        return self._admit(meta, temp)

    def _commit_large(self, temp: TempObject, meta: Meta, expect: str | None, folder: Path, data_path: Path,
                      meta_path: Path) -> Meta:
        """Blocking: checksum a large temp file's blocks (checked against
        `expect` when given), fsync it, rename it into place and write the
        meta that names it; `meta` with its block checksum."""
        step = "checksum"
        renamed = False
        try:
            rfd = os.open(temp.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                meta = replace(meta, blocks=blocks.compute(rfd, meta.size))
            finally:
                os.close(rfd)
            if expect is not None and blocks.summary(meta.blocks) != expect:
                temp.path.unlink(missing_ok=True)
                raise CorruptCopy(f"copy of {meta.key}: its bytes give block checksums "
                                  f"{blocks.summary(meta.blocks)}, its sender's are {expect}; not stored")
            step = "fsync"
            os.fsync(temp.fd)
            fd, temp.fd = temp.fd, -1
            os.close(fd)
            step = "mkdir"
            folder.mkdir(parents=True, exist_ok=True)
            step = "rename data"
            os.rename(temp.path, data_path)
            renamed = True
            step = "write meta"
            self._write_meta(meta_path, meta)
        except OSError as e:
            temp.path.unlink(missing_ok=True)
            if renamed:  # no meta names it: it would only be found, and deleted, at start-up
                data_path.unlink(missing_ok=True)
            raise StoreError(f"commit {meta.key}: {step}: {e}") from e
        return meta

    async def _commit_small(self, temp: TempObject, meta: Meta) -> Meta:
        """Seal a small temp file and rename it into place: no fsync (the group
        sync covers it), and on the event loop when the fill wrote it there."""
        oid = object_id(meta.slot)
        folder = self._dir_of(oid)
        # Lexical, as `data_path` is: every part of the name is hex, so it cannot leave the folder.
        final = os.path.join(folder, meta.data)
        kept = temp.kept

        def _commit() -> None:
            step = "read back"
            try:
                body = bytes(kept) if kept is not None and len(kept) == temp.written else \
                    small.read_back(temp.path, temp.written)
                step = "seal"
                small.finish(temp.fd, body, meta)
                fd, temp.fd = temp.fd, -1
                os.close(fd)
                step = "mkdir"
                self._folder(oid)
                step = "rename"
                os.rename(temp.path, final)
            except OSError as e:
                temp.path.unlink(missing_ok=True)
                raise StoreError(f"commit {meta.key}: {step}: {e}") from e

        if temp.inline:
            _commit()
        else:
            temp.committing = self._step(oid, _commit)
            await asyncio.shield(temp.committing)
        self.group_sync.committed()
        return meta

    def _admit(self, meta: Meta, temp: TempObject | None = None) -> Meta:
        """A committed object into the index, in place of what it replaces."""
        if temp is not None:
            self.release(temp.reserved)
            temp.reserved = 0
        if self._index.add_new(meta):  # nothing of its key held: nothing to replace
            return self._admitted(meta, meta.key)
        varied, slot = self._index.vary_of(meta.key), meta.slot
        old = self._index.drop(slot, reason="replaced")
        if old is not None:
            # Another file: a small object's name has a nonce of its own, as a
            # large one's data file has. A large one's meta goes with it when a
            # small one replaces it, since no meta names the small one.
            self._unlink_later(old, final=small.is_sealed(meta) and not small.is_sealed(old))
        # Responses stored under other Vary names (or none) no longer say how
        # this key varies: the newest response does (RFC 9111 §4.1).
        for other_slot in self._index.slots_of(meta.key):
            other = self._index.get(other_slot)
            if other.vary != meta.vary:
                self._index.drop(other_slot, reason="replaced")
                self._unlink_later(other, final=True)
        self._index.arrived(meta)  # its miss, counted once it is kept (`admission`)
        self._index.add(meta)
        if meta.vary:  # also when unchanged: an unlink queued above may have deleted the note
            self._note_vary(meta.key, meta.vary)
        elif varied:
            self._note_vary(meta.key, None)
        return self._admitted(meta, slot)

    def _admitted(self, meta: Meta, slot: str) -> Meta:
        """`meta`, just added to the index in `slot`, kept within the capacity and the hot copies' share."""
        if meta.hot and self.hot_capacity is not None:
            self._index.evict_hot_to(self.hot_capacity, keep=slot)
        if self.capacity is not None:
            self._index.evict_to(self.capacity, keep=slot)
        return meta

    def _write_meta(self, meta_path: Path, meta: Meta) -> None:
        write_meta(meta_path, meta, tmp=self.tmp)

    async def refresh(self, meta: Meta, *, headers: Pairs, stored_at: float, expires_at: float,
                      age: float = 0.0, stale_if_error: float, stale_while_revalidate: float) -> Meta:
        """A 304 from the origin: same bytes; the headers it updated (`headers`,
        merged by the caller), the expiry and stale allowances they now give,
        and an age counted from now."""
        current = self._index.get(meta.slot)
        if current is None or current.data != meta.data:
            return current or meta
        new = replace(meta, headers=headers, stored_at=stored_at, expires_at=expires_at, age=age,
                      stale_if_error=stale_if_error, stale_while_revalidate=stale_while_revalidate)
        oid = object_id(meta.slot)
        if small.is_sealed(meta):
            # Same name, new record: the body and the new seal in a temp
            # file renamed over the old one, durable with the next group sync.
            path = self._inside(self._dir_of(oid) / meta.data)
            step = lambda: small.reseal(path, new, tmp=self.tmp)  # noqa: E731
        else:
            path = self._inside(self._dir_of(oid) / f"{oid}.meta")
            step = lambda: self._write_meta(path, new)  # noqa: E731
        try:
            await asyncio.shield(self._step(oid, step))
        except OSError as e:
            raise StoreError(f"refresh {meta.key}: write meta: {e}") from e
        if small.is_sealed(meta):
            self.group_sync.committed()
        # Evicted or replaced while the meta was written: the queued unlink or
        # commit has the last word on disk, and the index must not revive it.
        # The same data file is the same object (a record read again from disk is another Meta).
        if (held := self._index.get(meta.slot)) is not None and held.data == current.data:
            self._index.replace(new)
        return new

    # -- a follower's copy of the index (cachenode/workers/) -------------------
    def mirror(self, event: str, meta: Meta) -> None:
        """Apply one change the writing worker's store announced (`watchers`).

        A follower never evicts or unlinks, and writes nothing but the sealed
        files of the leads the primary grants it (`write_unadmitted`), which
        the primary admits: its usage figures are the writer's, not its own to act on."""
        self._index.mirror(event, meta)


class CorruptCopy(StoreError):
    """A peer's copy whose bytes are not the ones its sender's checksum names: not committed."""
