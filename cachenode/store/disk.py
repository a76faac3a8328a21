"""The node's disk: complete objects only, named by key hash, LRU-evicted.

Layout under the data directory:

    objects/<2 hex>/<id>.meta            JSON: key, URL, headers, size, expiry, data file
    objects/<2 hex>/<id>.<nonce>.data    the bytes
    tmp/                                 fills in progress; emptied at start-up

A response that varies (`Vary`, RFC 9111 §4.1) is stored once per variant:
its slot in the index, and the name of its files, is its key plus the
canonical values of the request fields it varies on (cachenode/http/vary.py).
`lookup(key, request_headers)` finds the variant a request selects; the
names a key varies on are those of its most recently stored response.

An object becomes servable only by the rename of its `.meta`, which happens
after its data file is complete, verified against the origin's length,
fsynced and renamed into place. A crash at any step leaves either the old
object or no object, never a partial one; start-up deletes orphans.

Every file name comes from the SHA-256 of the key, and every path is checked
to lie under the data directory, so no request can read or write elsewhere.
Blocking calls run in the default executor; the in-memory index is touched
only from the event loop, so it needs no lock.

Hot copies (`Meta.hot`, docs/cache-node.md "Hot copies") are a cache of
the cache: they hold at most `hot_capacity` bytes (the least recently used
hot copy goes first beyond it), and whenever room is needed they are
evicted before any other object, least recently used first.

Disk steps on one object's files (commit, refresh, unlink after eviction or
replacement) run one after another, in the order they were asked for: an
eviction's unlink of `<id>.meta` that is still queued when the same key is
committed again must not land after the new meta. Unlinks are not awaited
by whoever caused them (eviction happens inside `reserve`, which is sync),
so the store tracks them; `idle()` waits until they are done.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import structlog

from cachenode.http.headers import Pairs
from nezha.keys import object_id
from cachenode.kernel.splice import FileWriteFailed, SocketBody
from cachenode.http.vary import variant as variant_of
from cachenode.store.objects import VARIANT_SEPARATOR, Meta, TempObject, TooLarge
from cachenode.store.writing import ObjectWrite
from nezha.chunks import chunk_of
from nezha.errors import StoreError

log = structlog.get_logger("nezha.store")


@dataclass
class _Usage:
    stored: int = 0
    reserved: int = 0
    hot: int = 0  # of `stored`, bytes of hot copies


class Store:
    def __init__(self, root: Path, *, capacity: int | None = None, clock: Callable[[], float] = time.time,
                 on_evict: Callable[[Meta], None] | None = None, hot_capacity: int | None = None) -> None:
        self.root = Path(root).resolve()
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        self.capacity = capacity
        self.hot_capacity = hot_capacity  # bytes hot copies may hold; None: only `capacity` bounds them
        self._clock = clock
        self._on_evict = on_evict
        self._index: OrderedDict[str, Meta] = OrderedDict()  # slot -> meta, LRU order: oldest first
        self._slots: dict[str, set[str]] = {}  # key -> its slots (one, or one per stored variant)
        self._vary: dict[str, tuple[str, ...]] = {}  # key -> the names its newest response varies on
        # object key -> the keys of its chunks stored here (nezha/chunks.py): an
        # invalidated object's chunks are found without a manifest or a scan.
        self._chunks: dict[str, set[str]] = {}
        self._hot: OrderedDict[str, None] = OrderedDict()  # slots of hot copies, LRU order as in _index
        self._usage = _Usage()
        self._pending: set[asyncio.Future] = set()  # disk steps not yet done
        # Told of every change to the index, in order: ("put", meta) and
        # ("drop", meta). A node's other workers follow the index this way
        # (cachenode/workers/), since only this process writes the store.
        self.watchers: list[Callable[[str, Meta], None]] = []
        self._last_step: dict[str, asyncio.Future] = {}  # object id -> its latest disk step

    # -- paths -------------------------------------------------------------
    def _dir_of(self, oid: str) -> Path:
        return self.objects / oid[:2]

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
    async def open(self) -> None:
        """Rebuild the index from disk; delete temporary and orphaned files."""
        metas, removed = await asyncio.get_running_loop().run_in_executor(None, self._scan)
        for meta in sorted(metas, key=lambda m: m.stored_at):
            self._add(meta)
        log.info("store_opened", root=str(self.root), objects=len(metas), bytes=self._usage.stored, removed=removed)
        if self.hot_capacity is not None:
            self._evict_hot_to(self.hot_capacity)
        if self.capacity is not None:
            self._evict_to(self.capacity)

    def _scan(self) -> tuple[list[Meta], int]:
        self.objects.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        removed = 0
        for leftover in self.tmp.iterdir():
            if leftover.is_file():
                leftover.unlink(missing_ok=True)
                removed += 1
        metas: list[Meta] = []
        for sub in self.objects.iterdir():
            if not sub.is_dir():
                continue
            wanted: set[str] = set()
            for mpath in sub.glob("*.meta"):
                meta = self._read_meta(mpath)
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
        return metas, removed

    @staticmethod
    def _read_meta(path: Path) -> Meta | None:
        try:
            raw = json.loads(path.read_text())
            meta = Meta(**raw)
            if "/" in meta.data or not meta.data.endswith(".data"):
                return None
            return meta
        except (OSError, ValueError, TypeError):
            return None

    # -- reads -------------------------------------------------------------
    def lookup(self, key: str, request_headers=None) -> Meta | None:
        """The stored response for `key` that a request with `request_headers`
        selects (RFC 9111 §4.1). Without headers, only a response that does
        not vary: who does not say what it asks for gets no variant."""
        names = self._vary.get(key)
        if names is None:
            slot = key
        elif request_headers is None:
            return None
        else:
            slot = f"{key}{VARIANT_SEPARATOR}{variant_of(names, request_headers)}"
        meta = self._index.get(slot)
        if meta is not None:
            self._index.move_to_end(slot)
            if meta.hot:
                self._hot.move_to_end(slot)
        return meta

    def __contains__(self, key: str) -> bool:
        return key in self._slots

    def keys(self) -> list[str]:
        return list(self._slots)

    def chunks_of(self, key: str) -> list[str]:
        """The keys of the chunks of the object `key` stored here, of any chunk size or version."""
        return sorted(self._chunks.get(key, ()))

    def metas(self) -> list[Meta]:
        """Every stored response, variants included, least recently used first."""
        return list(self._index.values())

    def _add(self, meta: Meta) -> None:
        self._index[meta.slot] = meta
        for watch in self.watchers:
            watch("put", meta)
        self._usage.stored += meta.size
        if meta.hot:
            self._hot[meta.slot] = None
            self._usage.hot += meta.size
        self._slots.setdefault(meta.key, set()).add(meta.slot)
        if (chunk := chunk_of(meta.key)) is not None:
            self._chunks.setdefault(chunk[0], set()).add(meta.key)
        if meta.vary:
            self._vary[meta.key] = meta.vary
        else:
            self._vary.pop(meta.key, None)

    def _drop(self, slot: str) -> Meta | None:
        meta = self._index.pop(slot, None)
        if meta is None:
            return None
        for watch in self.watchers:
            watch("drop", meta)
        self._usage.stored -= meta.size
        if meta.hot:
            self._hot.pop(slot, None)
            self._usage.hot -= meta.size
        slots = self._slots.get(meta.key)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._slots[meta.key]
                self._vary.pop(meta.key, None)
                if (chunk := chunk_of(meta.key)) is not None and (held := self._chunks.get(chunk[0])) is not None:
                    held.discard(meta.key)
                    if not held:
                        del self._chunks[chunk[0]]
        return meta

    @property
    def used_bytes(self) -> int:
        return self._usage.stored

    @property
    def hot_bytes(self) -> int:
        """Bytes of hot copies stored (part of `used_bytes`)."""
        return self._usage.hot

    def __len__(self) -> int:
        return len(self._index)

    # -- capacity ------------------------------------------------------------
    def fits(self, size: int) -> bool:
        return self.capacity is None or size <= self.capacity

    def reserve(self, size: int) -> None:
        """Make room for a fill of known size before its bytes arrive."""
        self._usage.reserved += size
        if self.capacity is not None:
            self._evict_to(self.capacity)

    def release(self, size: int) -> None:
        self._usage.reserved = max(0, self._usage.reserved - size)

    def _evict_to(self, limit: int, *, keep: str | None = None) -> None:
        """Evict least recently used objects until stored + reserved bytes fit `limit`.

        `keep` (the object just committed) goes last, and survives alone only
        while its own bytes fit: the reservations of fills still running may
        leave the total above the limit until they commit and evict in turn.
        """
        while self._usage.stored + self._usage.reserved > limit and self._index:
            hot = next((slot for slot in self._hot if slot != keep), None)
            if hot is not None:  # a hot copy is a cache of the cache: it goes first
                self._evict(hot)
                continue
            key = next(iter(self._index))
            if key == keep and len(self._index) > 1:
                self._index.move_to_end(key)
                continue
            if key == keep and self._usage.stored <= limit:
                break
            self._evict(key)

    def _evict_hot_to(self, limit: int, *, keep: str | None = None) -> None:
        """Evict least recently used hot copies until theirs fit `limit`; `keep` last."""
        while self._usage.hot > limit and self._hot:
            slot = next((s for s in self._hot if s != keep), next(iter(self._hot)))
            self._evict(slot)

    def _evict(self, slot: str) -> None:
        meta = self._drop(slot)
        assert meta is not None
        self._unlink_later(meta, final=True)
        log.info("object_evicted", key=meta.key, bytes=meta.size, **({"hot": True} if meta.hot else {}))
        if self._on_evict:
            self._on_evict(meta)

    def _unlink_later(self, meta: Meta, *, final: bool) -> asyncio.Future:
        """Delete an evicted or replaced object's data (and, if `final`, its meta) soon.

        The meta goes only if it still names this data file: a commit of the
        same key queued before this step may already have replaced it.
        """
        oid = object_id(meta.slot)
        d = self._dir_of(oid)
        data_path, meta_path = d / meta.data, d / f"{oid}.meta"

        def unlink() -> None:
            paths = [data_path]
            if final:
                current = self._read_meta(meta_path)
                if current is None or current.data == meta.data:
                    paths.append(meta_path)
            for p in paths:
                try:
                    self._inside(p).unlink(missing_ok=True)
                except OSError as e:
                    log.warning("unlink_failed", path=str(p), error=str(e))

        # Open readers keep their file descriptors; unlinking under them is safe.
        return self._step(oid, unlink)

    def _step(self, oid: str, fn: Callable[[], object]) -> asyncio.Future:
        """Run blocking `fn` in the executor after every earlier step on object `oid`.

        The returned future is tracked until done (see `idle`). Awaiting it
        through `asyncio.shield` keeps a cancelled caller from starting the
        next step while this one still runs in its thread.
        """
        loop = asyncio.get_running_loop()
        before = self._last_step.get(oid)
        if before is None:
            step = loop.run_in_executor(None, fn)
        else:
            step = loop.create_future()

            def start(_: asyncio.Future) -> None:
                inner = loop.run_in_executor(None, fn)

                def done(f: asyncio.Future) -> None:
                    if f.cancelled():
                        step.cancel()
                    elif f.exception() is not None:
                        step.set_exception(f.exception())
                    else:
                        step.set_result(f.result())
                inner.add_done_callback(done)
            before.add_done_callback(start)
        self._last_step[oid] = step
        self._pending.add(step)

        def finished(f: asyncio.Future) -> None:
            self._pending.discard(f)
            if self._last_step.get(oid) is f:
                del self._last_step[oid]
            if not f.cancelled():
                f.exception()  # retrieved here, so a cancelled awaiter leaves no "never retrieved" warning
        step.add_done_callback(finished)
        return step

    async def idle(self) -> None:
        """Wait until every disk step asked for so far (unlinks included) is done."""
        while self._pending:
            await asyncio.wait(list(self._pending))

    # -- writes --------------------------------------------------------------
    def writing(self, *, reserve: int = 0, readable: bool = True, must_write: bool = False) -> ObjectWrite:
        """The one way to write an object: temp file, reserved room, commit or
        discard, owned by one object (cachenode/store/writing.py)."""
        return ObjectWrite(self, reserve=reserve, readable=readable, must_write=must_write)

    async def new_temp(self) -> TempObject:
        """A fill's temp file in tmp/.

        A file system that refuses even to create it (full, out of inodes,
        over quota) does not fail the request: the temp object is then one
        whose every write fails, its reader an empty file, so the fill
        streams the body through unstored as for any failed write.
        """
        path = self.tmp / f"{secrets.token_hex(12)}.part"
        def create() -> tuple[int, int]:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                return fd, os.open(path, os.O_RDONLY)
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise

        try:
            fd, read_fd = await asyncio.get_running_loop().run_in_executor(None, create)
        except OSError as e:
            try:
                empty = os.open(os.devnull, os.O_RDONLY)
            except OSError:
                raise StoreError(f"create {path}: {e}") from e
            return TempObject(path=path, fd=-1, read_fd=empty, unwritable=f"create {path}: {e}")
        return TempObject(path=path, fd=fd, read_fd=read_fd)

    async def write(self, temp: TempObject, data: bytes) -> None:
        """Append `data` to the temp file; StoreError naming the file and the
        OS error (ENOSPC, EDQUOT, EIO...) when it cannot, with `temp.written`
        counting what did reach the file."""
        if temp.unwritable is not None:
            raise StoreError(temp.unwritable)

        def _write() -> None:
            def grew(n: int) -> None:
                temp.written += n  # readers may follow each step

            _pwrite_all(temp.fd, data, temp.written, grew)
            temp.wrote(len(data))
        try:
            await asyncio.get_running_loop().run_in_executor(None, _write)
        except OSError as e:
            raise StoreError(f"write {temp.path}: {e}") from e

    async def write_at(self, temp: TempObject, offset: int, data: bytes | memoryview) -> None:
        """Write `data` at `offset` of the temp file (a parallel fill's range);
        `temp.written` is the fill's to set, as the contiguous prefix grows."""
        if temp.unwritable is not None:
            raise StoreError(temp.unwritable)

        def _write() -> None:
            _pwrite_all(temp.fd, data, offset)
            temp.wrote(len(data))
        try:
            await asyncio.get_running_loop().run_in_executor(None, _write)
        except OSError as e:
            raise StoreError(f"write {temp.path} at {offset}: {e}") from e

    async def pump_into(self, temp: TempObject, body: SocketBody, offset: int, *, end: Callable[[], int],
                        moved: Callable[[int], None], read_timeout: float,
                        started: Callable[[asyncio.Future], None] | None = None) -> int:
        """Move `body` from its socket into the temp file at `offset` by splice
        on a thread (cachenode/kernel/splice.py): `write_at` for a body that never
        enters Python. StoreError, as from `write_at`, when the file side
        fails; the socket's errors pass as they are."""
        if temp.unwritable is not None:
            raise StoreError(temp.unwritable)
        try:
            return await body.pump_into(temp.fd, offset, end=end, moved=moved, read_timeout=read_timeout,
                                        started=started, landed=temp.wrote)
        except FileWriteFailed as e:
            raise StoreError(f"write {temp.path} at {e.at}: {e}") from e

    async def discard(self, temp: TempObject) -> None:
        """Drop a fill's temp file. Safe after a failed commit, which closed `fd` already."""
        self.release(temp.reserved)
        temp.reserved = 0
        if temp.committing is not None:
            # A commit whose caller was cancelled still runs in its thread; let it finish first.
            await asyncio.wait([temp.committing])

        def _discard() -> None:
            if temp.fd >= 0:
                fd, temp.fd = temp.fd, -1
                try:
                    os.close(fd)
                except OSError:
                    pass
            temp.path.unlink(missing_ok=True)
        await asyncio.get_running_loop().run_in_executor(None, _discard)

    async def commit(self, temp: TempObject, meta: Meta) -> Meta:
        """Make a finished temp file the servable object for `meta.key`.

        Raises TooLarge, before touching the disk, for bytes beyond the
        capacity: such an object would evict everything else and still not fit.
        """
        if not self.fits(temp.written):
            raise TooLarge(f"{meta.key}: {temp.written} bytes exceed the capacity of {self.capacity} bytes")
        if meta.hot and self.hot_capacity is not None and temp.written > self.hot_capacity:
            raise TooLarge(f"{meta.key}: {temp.written} bytes exceed the hot copies' share of {self.hot_capacity} "
                           f"bytes")
        oid = object_id(meta.slot)
        folder = self._dir_of(oid)
        meta = replace(meta, size=temp.written, data=f"{oid}.{secrets.token_hex(6)}.data")
        data_path = self._inside(folder / meta.data)
        meta_path = self._inside(folder / f"{oid}.meta")

        def _commit() -> None:
            step = "fsync"
            renamed = False
            try:
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

        temp.committing = self._step(oid, _commit)
        await asyncio.shield(temp.committing)
        self.release(temp.reserved)
        temp.reserved = 0
        old = self._drop(meta.slot)
        if old is not None:
            self._unlink_later(old, final=False)
        # Responses stored under other Vary names (or none) no longer say how
        # this key varies: the newest response does (RFC 9111 §4.1).
        for slot in list(self._slots.get(meta.key, ())):
            other = self._index[slot]
            if other.vary != meta.vary:
                self._drop(slot)
                self._unlink_later(other, final=True)
        self._add(meta)
        if meta.hot and self.hot_capacity is not None:
            self._evict_hot_to(self.hot_capacity, keep=meta.slot)
        if self.capacity is not None:
            self._evict_to(self.capacity, keep=meta.slot)
        return meta

    def _write_meta(self, meta_path: Path, meta: Meta) -> None:
        tmp = self.tmp / f"{secrets.token_hex(12)}.meta"
        try:
            with open(tmp, "w") as f:
                json.dump(asdict(meta), f)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, meta_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

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
        path = self._inside(self._dir_of(oid) / f"{oid}.meta")
        try:
            await asyncio.shield(self._step(oid, lambda: self._write_meta(path, new)))
        except OSError as e:
            raise StoreError(f"refresh {meta.key}: write meta: {e}") from e
        # Evicted or replaced while the meta was written: the queued unlink or
        # commit has the last word on disk, and the index must not revive it.
        if self._index.get(meta.slot) is current:
            self._index[meta.slot] = new
            for watch in self.watchers:
                watch("put", new)
        return new

    async def remove(self, key: str) -> list[Meta]:
        """Forget every stored response of `key`, variants included; what went.

        Returns once their data files are unlinked: a node's other workers
        (cachenode/workers/) may still hold the old entry in their copy of the
        index for a moment, and must find no file to open after a write that
        removed it has been answered."""
        gone, steps = [], []
        for slot in list(self._slots.get(key, ())):
            meta = self._drop(slot)
            if meta is not None:
                steps.append(self._unlink_later(meta, final=True))
                gone.append(meta)
        if steps:
            await asyncio.shield(asyncio.gather(*steps, return_exceptions=True))
        return gone

    async def remove_one(self, meta: Meta) -> bool:
        """Forget the one stored response `meta` (its variant only), if still
        stored; returns once its data file is unlinked, as `remove` does."""
        if self._index.get(meta.slot) is not meta:
            return False
        self._drop(meta.slot)
        await asyncio.shield(self._unlink_later(meta, final=True))
        return True

    # -- a follower's copy of the index (cachenode/workers/) -------------------
    def mirror(self, event: str, meta: Meta) -> None:
        """Apply one change the writing worker's store announced (`watchers`).

        A follower only reads: it never writes, evicts or unlinks, so its
        usage figures are the writer's, not its own to act on."""
        self._drop(meta.slot)
        if event == "put":
            self._add(meta)

    def touch(self, slot: str) -> None:
        """A read of `slot` served elsewhere (another worker) counts as a use for LRU."""
        if slot in self._index:
            self._index.move_to_end(slot)
            if slot in self._hot:
                self._hot.move_to_end(slot)


def _pwrite_all(fd: int, data: bytes | memoryview, at: int, wrote: Callable[[int], None] | None = None) -> None:
    """All of `data` into `fd` from offset `at`, however many writes it takes
    (pwrite may write less than asked); `wrote(n)` after each."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        at += n
        view = view[n:]
        if wrote is not None:
            wrote(n)
