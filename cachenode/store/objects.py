"""What the store holds: a stored object's record (`Meta`), a fill's temp
file (`TempObject`), and why a body was not stored (`NotStored`).

Apart from the store itself (`store/disk.py`) because every room names
them: the handler judges a `Meta`'s freshness, a fill writes a
`TempObject`, the counts count what a `Meta` weighs.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cachenode.http.headers import Pairs, first
from cachenode.store.writeback import WriteBehind
from nezha.chunks import Manifest
from nezha.errors import NezhaError


_intern = sys.intern  # a module's global, not an attribute looked up per header of every `Meta`
# Between a key and a variant in a slot: keys never hold control characters.
VARIANT_SEPARATOR = "\n"


class NotStored(NezhaError):
    """A fill's bytes reached its clients whole but were not stored: no failure."""


class TooLarge(NotStored):
    """An object's bytes exceed the store's capacity: it was streamed, never stored."""


class Refused(NotStored):
    """The store is full of objects still read, and the eviction policy kept
    them over this newcomer (docs/cache-node.md "Eviction"): streamed, not stored."""


def slot_of(key: str, *, vary: tuple[str, ...], variant: str) -> str:
    """A stored response's place in the store (`Meta.slot`), before its `Meta` is built."""
    return f"{key}{VARIANT_SEPARATOR}{variant}" if vary else key


@dataclass(frozen=True, slots=True)
class Meta:
    """A stored response: where its bytes are, and what the origin said with them.

    `headers` are the origin's end-to-end fields as (name, value) pairs in the
    order it sent them (cachenode/http/headers.py says which are kept); a dict
    from a meta written before that is read as its pairs.
    """

    key: str
    url: str
    host: str
    size: int
    headers: Pairs
    stored_at: float
    expires_at: float
    stale_if_error: float = math.inf  # seconds past expiry it may answer when the origin fails
    data: str = ""  # data file name, relative to the object's folder
    age: float = 0.0  # the response's Age when it was stored (RFC 9111 §4.2.3)
    stale_while_revalidate: float = 0.0  # seconds past expiry it may answer while revalidating (RFC 5861)
    status: int = 200  # a stored 404 or 301 is answered with its own status (RFC 9111 §4.2.2)
    vary: tuple[str, ...] = ()  # the request fields its Vary names, lowercased and sorted
    variant: str = ""  # their values in the request that fetched it (cachenode/http/vary.py)
    # Stored for an `authorize` origin: served only once the origin allows
    # each read (front/authorized.py), whatever the origin's mode is by then.
    # A switch back to `pass`, or a `pass` node mid-rollout, must not hand a
    # private object to anyone who asks (docs/private-objects.md).
    authorize: bool = False
    # A hot copy: a non-owner's copy of an object read often through it,
    # copied from an owner with the owner's expiry. A cache of the cache:
    # never counted as held in the index, never replicated or handed off,
    # held within the store's hot share and evicted before anything else.
    hot: bool = False
    # An extra copy: stored here though another node is the key's first
    # owner (a replica). Set by the store when it commits the object; under
    # pressure given up before the only copy of another object.
    extra: bool = False
    # A chunked object's manifest (nezha/chunks.py): its `length` bytes are
    # chunks of `chunk_size`, each a stored object on the owners of its own
    # chunk key; this object's data file is empty, and `size` (what it
    # weighs here) 0. 0: the object is stored whole. A chunk itself keeps
    # its object's `length` (and chunk_size 0), so it can be placed alone.
    chunk_size: int = 0
    length: int = 0
    # The node's own checksum of a large object's bytes, per block
    # (cachenode/store/blocks.py), computed when it was committed. "": a
    # small object (its seal checks it), or one stored before there was one.
    blocks: str = ""

    def __post_init__(self) -> None:
        # A store holds a million of these (docs/cache-node.md "Memory per object"): what
        # repeats is shared (slots, no __dict__; header names and hosts interned; a URL
        # equal to the key is the key).
        h = self.headers
        pairs = tuple(h.items()) if isinstance(h, dict) else tuple([(_intern(str(n)), str(v)) for n, v in h])
        object.__setattr__(self, "headers", pairs)
        # A field set again only when it changes (an exact tuple is its own tuple; an interned host is itself).
        if type(self.vary) is not tuple:
            object.__setattr__(self, "vary", tuple(self.vary))
        if (host := _intern(self.host)) is not self.host:
            object.__setattr__(self, "host", host)
        if self.url is not self.key and self.url == self.key:
            object.__setattr__(self, "url", self.key)
        if isinstance(self.stale_if_error, bool):  # a meta written when this was yes or no
            object.__setattr__(self, "stale_if_error", math.inf if self.stale_if_error else 0.0)

    @property
    def manifest(self) -> Manifest | None:
        """The chunked object's manifest this meta holds; None for an object stored whole."""
        return Manifest(chunk_size=self.chunk_size, length=self.length) if self.chunk_size else None

    @property
    def body_size(self) -> int:
        """The object's length as clients see it: `length` for a chunked one, else what is stored."""
        return self.length if self.chunk_size else self.size

    def header(self, name: str) -> str | None:
        return first(self.headers, name)

    @property
    def slot(self) -> str:
        """Its place in the store: the key, plus the variant for a response that varies."""
        return slot_of(self.key, vary=self.vary, variant=self.variant)

    @property
    def etag(self) -> str | None:
        return self.header("ETag")

    @property
    def last_modified(self) -> str | None:
        return self.header("Last-Modified")

    def age_at(self, now: float) -> int:
        """The Age a reuse of this response carries now (RFC 9111 §4.2.3, §5.1)."""
        return int(self.age + max(0.0, now - self.stored_at))

    def fresh(self, now: float) -> bool:
        return now < self.expires_at


@dataclass
class TempObject:
    """A fill's file in tmp/. The writer owns `fd`; readers duplicate `read_fd`.

    `read_fd` is opened with the file, so a reader never depends on the
    file's name, which changes when the fill commits and vanishes when it
    fails. Its owner (the fill) closes it when no new reader can arrive.
    A descriptor is set to -1 the moment it is closed, so nothing closes the
    same number twice (by then it may belong to another file).
    """

    path: Path
    fd: int
    read_fd: int
    written: int = 0
    reserved: int = 0
    committing: asyncio.Future | None = None  # the commit's disk step, once asked for
    # Why the file could not be created (no space, no inode): every write then
    # fails with it, and the fill streams from memory instead (cachenode/fill/buffer.py).
    unwritable: str | None = None
    # Starts the disk writing the file behind its writers, so the commit's
    # fsync has little left to do (cachenode/store/writeback.py).
    behind: WriteBehind | None = None
    # A small object's temp file (cachenode/store/small.py): written on the
    # event loop, no write-behind, and `kept` holds the bytes written in
    # order (None once a write lands elsewhere), so the commit seals them
    # without reading the file back.
    inline: bool = False
    kept: bytearray | None = None

    def __post_init__(self) -> None:
        if self.behind is None and self.fd >= 0 and not self.inline:
            self.behind = WriteBehind(self.fd)

    def wrote(self, n: int) -> None:
        if self.behind is not None and self.fd >= 0:
            self.behind.wrote(n)


def close_reader(temp: TempObject) -> None:
    """Close `temp`'s reading descriptor, for a writer that serves no reader
    from the growing file (a chunk, a manifest): else it stays open for good."""
    if temp.read_fd >= 0:
        fd, temp.read_fd = temp.read_fd, -1
        os.close(fd)
