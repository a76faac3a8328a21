"""Small objects' files: sealed in one go, read back and checked.

An object of at most `SMALL_MAX` bytes is stored as one file,
`objects/<2 hex>/<id>.<nonce>.obj`: its body from byte 0, then its record
(the `Meta`) and the trailer that seals both (cachenode/store/sealed.py).
No `.meta` beside it, no fsync of its own (cachenode/store/syncer.py makes
a batch of them durable), and its writes happen on the event loop: a file
of a few pages goes to the page cache in microseconds, less than a hand-off
to a thread and back costs (docs/cache-node.md, "Small objects").

Everything here blocks; the store calls it on the loop only for small files.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from cachenode.store.objects import Meta, Refused, TooLarge, slot_of
from cachenode.store.rows import digest_of
from cachenode.store.record_json import record_json, record_of
from cachenode.store.sealed import TRAILER_SIZE, Unsealed, seal_encoded, unseal
from nezha.errors import StoreError
from nezha.keys import object_id

# Objects up to this many bytes take the small path. Measured with
# bench/small_files.py (docs/benchmarks.md, "Small objects"): at 16, 64 and
# 128 KiB it costs a cold fill a third to a half less CPU than the large
# path; at 256 KiB nothing less, as copying the body through Python costs
# what the fsyncs and threads saved.
SMALL_MAX = 128 * 1024
SUFFIX = ".obj"


def is_sealed(meta: Meta) -> bool:
    """Whether `meta`'s bytes are a sealed small object's file."""
    return meta.data.endswith(SUFFIX)


def read_back(path: Path, size: int) -> bytes:
    """The first `size` bytes of the file at `path` (a temp file written in ranges or by splice)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _pread_all(fd, size, 0)
    finally:
        os.close(fd)


def finish(fd: int, body: bytes, meta: Meta) -> None:
    """Append the record and trailer sealing `body` (already at the start of `fd`)."""
    tail = seal_encoded(body, record_json(meta))
    view = memoryview(tail)
    at = meta.size
    while view:
        n = os.pwrite(fd, view, at)
        at += n
        view = view[n:]


def reseal(path: Path, meta: Meta, *, tmp: Path) -> None:
    """Give the sealed file at `path` a new record (a 304's headers and expiry):
    its body and the new seal in a temp file renamed over it. Nothing when the
    file is gone (evicted or replaced meanwhile: what removed it has the last
    word); OSError when it cannot be read or written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        body = _pread_all(fd, meta.size, 0)
    finally:
        os.close(fd)
    temp = tmp / f"{secrets.token_hex(12)}.part"
    try:
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _write_sealed(out, body, meta)
        finally:
            os.close(out)
        os.rename(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def check(fd: int, meta: Meta) -> bool:
    """Whether the open file `fd` is `meta`'s object, whole: the seal holds and
    its record names the same data file and size. Reads the whole file (a
    small one, usually from the page cache)."""
    try:
        length = os.fstat(fd).st_size
        size, record = unseal(_pread_all(fd, length, 0))
    except (OSError, Unsealed):
        return False
    return size == meta.size and record.get("data") == meta.data and record.get("size") == meta.size


def read_sealed(path: Path) -> Meta | None:
    """The object in a sealed file, checked whole; None when it is not one (torn, damaged, another format)."""
    try:
        with open(path, "rb") as f:
            whole = f.read()
        size, record = unseal(whole)
        meta = Meta(**record)
    except (OSError, Unsealed, TypeError, ValueError):
        return None
    if meta.size != size or meta.data != path.name or "/" in meta.data:
        return None
    return meta


class SealedWrites:
    """A small body that is whole in memory, stored in one go: one file created
    under its final name, one write of body and seal, no rename. What a fill stored at once
    (cachenode/fill/at_once.py) takes instead of a temp file it writes and
    commits in steps (`Store.new_temp`, `Store.commit`): no second descriptor,
    no copy of the body kept beside the file, no `Meta` built again at the
    commit, no read of the body back to seal it.

    A mixin of `Store`, as `TempFiles` is. Needs of the class it is mixed
    into: `tmp`, `capacity`, `hot_capacity`, `group_sync`, `_index`,
    `_extra`, `_folder`, `_load`, `_admit`, `reserve`, `release`, `fits`.
    """

    def named(self, meta: Meta, size: int, *, sealed: bool) -> Meta:
        """`meta` as the store keeps it once committed with `size` bytes: its
        size, whether it is an extra copy here, and its data file's name
        (a nonce of its own, so a replaced object's file is never this one)."""
        return replace(meta, size=size, extra=self._extra_copy(meta.key, hot=meta.hot),
                       data=_data_name(object_id(meta.slot), sealed=sealed))

    def _extra_copy(self, key: str, *, hot: bool) -> bool:
        """Whether a copy of `key` stored here is an extra copy (a hot copy is not: it is counted apart)."""
        return not hot and self._extra is not None and self._extra(key)

    def admission(self, meta: Meta, *, reserved: int) -> None:
        """Whether the store keeps `meta` (named already) when committed: TooLarge
        for bytes beyond the capacity or the hot copies' share, Refused when
        the store is full of objects it keeps. A refusal is counted by the
        policy as a miss; a newcomer kept is counted when it is added
        (`_admit`), so a write that fails in between (ENOSPC, a failed rename,
        a copy whose checksum differs) leaves the policy and its census as
        they were, and the fill that tries the write again counts it once."""
        if not self.fits(meta.size):
            raise TooLarge(f"{meta.key}: {meta.size} bytes exceed the capacity of {self.capacity} bytes")
        if meta.hot and self.hot_capacity is not None and meta.size > self.hot_capacity:
            raise TooLarge(f"{meta.key}: {meta.size} bytes exceed the hot copies' share of {self.hot_capacity} "
                           f"bytes")
        self._load(meta.key)
        if self.capacity is not None and not self._index.admits(meta, None, self.capacity,
                                                                 reserved_here=reserved):
            self._index.arrived(meta)
            raise Refused(f"{meta.key}: the store is full of objects still read, and keeps them")

    def put_sealed(self, body: bytes, *, key: str, vary: tuple[str, ...] = (), variant: str = "",
                   hot: bool = False, **record: Any) -> Meta:
        """`body` stored at once as the object of `key` (and `variant`), whose
        record `record` gives (the other fields of its `Meta`; its size, data
        file and extra flag are the store's), and in the index: room made for
        it and admitted (TooLarge, Refused as `admission`), written with its
        seal in one go to a new file under its final name, left to the group
        sync to make durable. What a fill whose body is whole in memory
        (cachenode/fill/at_once.py), checked already, takes: one call, no
        descriptor kept open, the `Meta` built once. StoreError naming the file and the OS error when
        it cannot be created or written: nothing is left behind then, and
        nothing is in the index."""
        meta = _sealed_meta(len(body), key, vary, variant, hot, self._extra_copy(key, hot=hot), record)
        size = meta.size
        if self.capacity is None or self._index.room_for(size, self.capacity):
            # Its room reserved and released around the write would evict nothing and
            # leave the usage as it is: the admission weighs it unreserved, as it would reserved.
            self.admission(meta, reserved=0)
            self.write_unadmitted(meta, body)
        else:
            self.reserve(size)  # room made first: what it evicts goes before the admission
            try:
                self.admission(meta, reserved=size)
                self.write_unadmitted(meta, body)
            finally:
                self.release(size)
        self.group_sync.committed()
        return self._admit(meta)

    def admit_sealed(self, meta: Meta) -> Meta:
        """A sealed file another worker of this node wrote whole under its final
        name (`write_sealed_file`: a follower's lead, cachenode/workers/lead_desk.py)
        admitted as `put_sealed` admits its own: room made, kept or refused,
        left to the group sync, indexed. TooLarge or Refused as `admission`,
        and the file is then deleted: nothing names it."""
        meta = replace(meta, extra=self._extra_copy(meta.key, hot=meta.hot))
        self._load(meta.key)
        held = self._index.get(meta.slot)
        if held is not None and held.data == meta.data:
            return held  # the start-up scan found the file first and loaded it: admitted already
        self.reserve(meta.size)
        try:
            self.admission(meta, reserved=meta.size)
        except (TooLarge, Refused):
            self.drop_sealed(meta)
            raise
        finally:
            self.release(meta.size)
        self.group_sync.committed()
        return self._admit(meta)

    def write_unadmitted(self, meta: Meta, body: bytes) -> None:
        """Write `meta`'s sealed file (`sealed_meta`, `write_sealed_file`) and
        nothing else: what `put_sealed` does between its admission and its
        index, and all a follower leading a fill does, whose primary alone
        admits it (`admit_sealed`). StoreError as `write_sealed_file`."""
        write_sealed_file(self._folder(_oid_of(meta)), meta, body)

    def drop_sealed(self, meta: Meta) -> None:
        """Delete the sealed file of `meta`, which the index does not name: a
        follower's lead the primary refused, could not admit, or had released."""
        with contextlib.suppress(OSError):
            os.unlink(f"{self._folder(_oid_of(meta))}/{meta.data}")

    # Provided by the class mixed into (`Store`).
    tmp: Path
    capacity: int | None
    hot_capacity: int | None
    _extra: Callable[[str], bool] | None


def _data_name(oid: str, *, sealed: bool) -> str:
    """A stored object's data file: a nonce of its own, so a replaced object's file is never this one.

    48 bits of `random`'s generator (seeded from the OS at start and again in
    each forked process), not `secrets`': the nonce must differ from the file
    it replaces, not be unguessable, and `secrets` asks the kernel (a
    `getrandom` call) for every file."""
    return f"{oid}.{_getrandbits(48):012x}{SUFFIX if sealed else '.data'}"


# The module's generator's own method (what `random.getrandbits` is), found once rather than per file.
_getrandbits = random.getrandbits


def sealed_meta(size: int, *, key: str, vary: tuple[str, ...] = (), variant: str = "", hot: bool = False,
                extra: bool = False, **record: Any) -> Meta:
    """The `Meta` of a small object of `size` bytes about to be written at once:
    its data file a new sealed file's name in its slot's folder. Its slot is
    hashed by the index's `digest_of` (`object_id` is its hex), which
    remembers it: the admission and the index ask for the same slot's digest
    next, and get it without hashing the key again."""
    return _sealed_meta(size, key, vary, variant, hot, extra, record)


def _sealed_meta(size: int, key: str, vary: tuple[str, ...], variant: str, hot: bool, extra: bool,
                 record: dict[str, Any]) -> Meta:
    """`sealed_meta`, its record's other fields a dict taken as it is: `put_sealed`'s own
    keywords are not gathered into a dict once more (a microsecond a put)."""
    oid = digest_of(slot_of(key, vary=vary, variant=variant)).hex()
    return Meta(key=key, vary=vary, variant=variant, hot=hot, size=size, extra=extra,
                data=_data_name(oid, sealed=True), **record)


def well_named(meta: Meta) -> bool:
    """Whether `meta` names a sealed file of its own slot, in its slot's folder
    (`_data_name`): what a record from another process must show before the
    store admits, or deletes, the file it names."""
    oid, dot, rest = meta.data.partition(".")
    return bool(dot) and "/" not in meta.data and oid == object_id(meta.slot) and rest.endswith(SUFFIX)


def _oid_of(meta: Meta) -> str:
    """The object id a sealed file's name begins with (`_data_name`): its folder's, without hashing the slot again."""
    return meta.data.partition(".")[0]


def write_sealed_file(folder: str, meta: Meta, body: bytes) -> None:
    """`body` and its seal written in one go to a new file at `meta.data` in
    `folder` (its slot's: `Store._folder`): no temp file and no rename. Its
    name's nonce makes it a file no one else writes or reads until it is
    admitted to the index, and its seal is what makes it whole: a file a crash
    leaves short, empty or zero-filled fails the seal and is removed by the
    start-up scan (`layout.scan_folder`) before anything could serve it
    (docs/cache-node.md, "Small objects"). Safe in any worker of the node: the
    nonce comes from `random`, seeded anew in each process. StoreError, and no
    file left, when the create or the write fails."""
    path = f"{folder}/{meta.data}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StoreError(f"create {path}: {e}") from e
    try:
        try:
            _write_sealed(fd, body, meta)
        finally:
            os.close(fd)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise StoreError(f"write {path}: {e}") from e


def _write_sealed(fd: int, body: bytes, meta: Meta) -> None:
    """`body` and its seal from offset 0 of `fd`, in one write (copying 16 KiB costs less than a second call);
    a view of them is made only for what a short write left."""
    whole = body + seal_encoded(body, record_json(meta))
    at = os.pwrite(fd, whole, 0)
    if at < len(whole):
        view = memoryview(whole)
        while at < len(whole):
            at += os.pwrite(fd, view[at:], at)


def _pread_all(fd: int, size: int, at: int) -> bytes:
    parts = []
    while size > 0:
        chunk = os.pread(fd, size, at)
        if not chunk:
            raise OSError(f"file ends {size} bytes early")
        parts.append(chunk)
        at += len(chunk)
        size -= len(chunk)
    return b"".join(parts)


__all__ = ["SMALL_MAX", "SUFFIX", "TRAILER_SIZE", "SealedWrites", "check", "finish", "is_sealed", "read_back", "read_sealed", "record_of", "reseal",
           "sealed_meta", "well_named", "write_sealed_file"]
