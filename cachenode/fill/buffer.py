"""The fill buffer: one object's body on its way from the source to the
store, read by every client of its flight as it grows.

The body is written to a temp file by a task of its own (so a leader that
disconnects does not cancel it), and every reader streams from that file;
late readers start from byte 0 of the file, so they get bytes already
streamed without the node holding them in memory.

A fill is `complete` once the whole body has arrived and matches the
origin's length; its streams end there. Storing it is a separate step that
may still refuse (a body without Content-Length that outgrew the capacity,
a disk error): the clients got every byte either way. Two kinds of fill
are never stored at all:

- a body delimited only by the origin closing its connection (RFC 9112
  §6.3): one cut short looks exactly like a whole one, so it is streamed to
  everyone waiting and then dropped (`Unprovable`);
- a body the store cannot write (a full disk, a quota, any write error):
  the temp file is dropped at once and the bytes from there on are handed
  to the readers from memory (`StoreUnwritable`), bounded by the slowest
  reader (cachenode/fill/readers.py). Its flight lands at once
  (`on_unstored`), so requests that come later fetch for themselves
  instead of joining a stream whose start is gone.

No aiohttp here: the body arrives as an async iterator of chunks, a
spliced socket, or parallel ranges written at their offsets.
"""

from __future__ import annotations

import asyncio
import os
from typing import IO, AsyncIterator, Awaitable, Callable

import structlog

from cachenode.fill.readers import MEMORY_WINDOW, READER_PATIENCE, Readers
from cachenode.fill.slices import Ranges
from cachenode.fill.unstored import StoreUnwritable, Superseded, Unprovable
from cachenode.fill.verify import BodyCheck, DigestMismatch
from cachenode.kernel import splice
from cachenode.http.digests import Expected
from cachenode.http.headers import Pairs
from cachenode.store.disk import Store
from cachenode.store.objects import Meta, NotStored, TempObject
from cachenode.store.writing import ObjectWrite
from nezha.errors import FillAborted, NezhaError, StoreError

log = structlog.get_logger("nezha.fill")


class RangesAbandoned(NezhaError):
    """A parallel range fetch stopped (an origin that ignores or mangles
    Range, a changed validator, a failed stream): the fill carries on from
    its prefix with one plain stream."""


class Fill:
    """Bytes of one object arriving from the origin into a temp file (or,
    once the store cannot write, through memory)."""

    def __init__(self, *, key: str, headers: Pairs, length: int | None, write: ObjectWrite,
                 age: float = 0.0, status: int = 200, vary: tuple[str, ...] = (), variant: str = "",
                 delimited_by_close: bool = False, window: int = MEMORY_WINDOW,
                 patience: float = READER_PATIENCE, on_unstored: Callable[[], None] | None = None,
                 ranges: Ranges | None = None, check: BodyCheck | None = None,
                 blocks: str | None = None) -> None:
        self.key = key
        self.status = status
        self.vary = vary  # the request fields the response varies on, and the fill's values of them
        self.variant = variant
        self.headers = headers  # the fields stored with the object (cachenode/http/headers.py)
        self.age = age  # the origin's Age: a response from a cache upstream is that old already
        self.length = length
        # The store's write of the object (opened: its temp file and room), committed or discarded by `run`.
        self.writing = write
        self.temp: TempObject = write.temp
        self.url: str | None = None  # where the bytes come from, once `run` starts
        self.complete = False  # every byte has arrived (on disk, or through memory), length verified
        self.meta: Meta | None = None  # set when committed
        self.error: NezhaError | None = None
        # The body's end is the origin's connection closing: streamed, never stored.
        self.delimited_by_close = delimited_by_close
        # Called once when the fill stops writing to the store (its flight lands
        # then: cachenode/fill/flights.py `flight_fill`).
        self._on_unstored = on_unstored
        self._received = 0
        # A parallel fetch writing the body in ranges: how far the bytes on
        # disk reach from an offset beyond the prefix, and how to ask for a
        # range first. None once it gave up and the rest is one stream.
        self._ranges = ranges
        # An on-demand parallel fetch: only bytes a reader asks for are
        # fetched, so every reader asks, at the prefix too; parked while
        # every asked-for byte is on disk.
        self.on_demand = ranges is not None and ranges.on_demand
        # The source published a digest of the body (cachenode/fill/verify.py):
        # its last byte reaches no reader until the bytes have matched it.
        self._check = check
        # A peer's copy: the summary of its block checksums (nezha/wire.py
        # BLOCKS_HEADER), which the bytes must give before they are committed.
        self._blocks = blocks
        self.parked = False
        self._progress = asyncio.Event()
        self._writes: set[asyncio.Task] = set()  # writes still running in threads (track)
        self._store_error: StoreError | None = None  # once the store failed
        # The open readers, and the bytes held in memory for them once the store failed.
        self._readers = Readers(received=lambda: self._received, window=window, patience=patience)

    def open_reader(self) -> IO[bytes]:
        """A file object of its own on the fill's bytes, valid whatever happens to the name.

        Raises FillAborted once the fill has ended and closed its reader (a
        joiner that woke late): the fill's error if it failed; otherwise its
        `meta` (stored) or `complete` (streamed, not stored) says what is left.
        Also raised when the store failed and bytes this reader would need
        are no longer held.
        """
        if self.temp.read_fd < 0:
            if self.error is not None and not self.complete:
                raise FillAborted(f"fill of {self.key} from {self.url} failed: {self.error}") from self.error
            raise FillAborted(f"fill of {self.key} from {self.url} ended before this reader opened")
        spilled_at, memory_start = self._readers.spilled_at, self._readers.memory_start()
        if spilled_at is not None and memory_start > spilled_at:
            raise FillAborted(f"fill of {self.key} from {self.url} is not being stored and has passed on bytes "
                              f"{spilled_at}-{memory_start - 1}, which it no longer holds")
        fd = os.dup(self.temp.read_fd)
        try:
            return self._readers.open(fd)
        except BaseException:
            os.close(fd)
            raise

    def close_reader(self) -> None:
        if self.temp.read_fd >= 0:
            os.close(self.temp.read_fd)
            self.temp.read_fd = -1

    @property
    def written(self) -> int:
        """Bytes of the body that have arrived (on disk, or in memory once the store failed)."""
        return self._received

    @property
    def on_disk(self) -> int:
        """Bytes a reader's file holds: every byte, unless the store failed; then
        those written before it did, and the rest come from `from_memory`."""
        return self.temp.written if self._readers.spilled_at is None else self._readers.spilled_at

    def from_memory(self, reader: IO[bytes], offset: int, upto: int) -> memoryview:
        """Bytes from `offset` (at or past `on_disk`) up to at most `upto`, for a
        reader that has sent every byte before `offset`; at least one byte when
        `upto > offset` and the bytes have arrived.

        Raises FillAborted when the reader was cut off for stalling, or when
        the bytes are no longer held: the reader's connection must break.
        """
        self._advance(reader, offset)
        if (held := self._readers.held(offset, upto)) is not None:
            return held
        raise FillAborted(f"fill of {self.key} from {self.url} no longer holds byte {offset}")

    @property
    def spilled(self) -> bool:
        """The store failed: bytes from `on_disk` on come from `from_memory`."""
        return self._readers.spilled_at is not None

    def _available(self, offset: int) -> int:
        available = self._received if offset < self._received or self._ranges is None \
            else self._ranges.covered_until(offset)
        if self._check is not None and not self.complete and self.length is not None and not self.on_demand:
            # Held back until the digest matched (an on-demand fill may never
            # have the whole body: its ranges go out as they land).
            return min(available, self.length - 1)
        return available

    @property
    def checked_against(self) -> Expected | None:
        """The digest this fill's bytes are checked against (None: none), which
        an owner hands to the peer relaying them (nezha/wire.py DIGEST_HEADER)."""
        return self._check.verifier.expected if self._check is not None else None

    @property
    def verified_by(self) -> str | None:
        """The field whose digest the stored bytes matched (None: none was checked)."""
        return self._check.field if self._check is not None and self.meta is not None else None

    @property
    def finished(self) -> bool:
        return self.meta is not None or self.error is not None

    def _notify(self) -> None:
        if self._check is not None and self._readers.spilled_at is None:
            self._check.grew(self._received)
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_beyond(self, offset: int, *, reader: IO[bytes] | None = None, end: int | None = None) -> int:
        """Block until more than `offset` bytes have arrived, or the body is complete.

        Returns where the bytes available from `offset` end (== `offset` only
        when complete): the prefix, or during a parallel fetch the run of
        bytes on disk from `offset`, whose slice is then fetched first. Raises
        FillAborted if the fill failed before the body was complete, so a
        client mid-stream sees a broken connection, not a short body.

        `reader` (from `open_reader`, having sent every byte before `offset`)
        reports progress: once the store failed, the fill waits for its
        readers, and returns at most a quarter window at a time so that even
        a reader still sending from the file says how far it is. `end` is
        where the reader's request ends: an on-demand fill fetches up to there.
        """
        if reader is not None:
            self._advance(reader, offset)
        asked = False
        while True:
            available = self._available(offset)
            if available > offset or self.complete:
                if reader is not None and self._readers.spilled_at is not None:
                    return min(self.written, offset + max(1, self._readers.window // 4))
                return max(available, self.written) if self.complete else available
            if self._ranges is not None and not asked and (offset > self._received or self.on_demand):
                # Beyond the prefix (a Range in the middle): the slice holding
                # `offset` goes first. At the prefix, front-first order serves,
                # unless the fill fetches only what readers ask for.
                self._ranges.want(offset, (end or self.length or offset + 1) if self.on_demand else offset + 1)
                asked = True
            if self.error is not None:
                raise FillAborted(f"fill of {self.key} from {self.url} failed: {self.error}") from self.error
            await self._progress.wait()

    async def wait_finished(self) -> Meta:
        """The committed object, once the whole body is on disk; FillAborted otherwise."""
        while True:
            if self.error is not None:
                raise FillAborted(f"fill of {self.key} failed: {self.error}") from self.error
            if self.meta is not None:
                return self.meta
            await self._progress.wait()

    # -- memory, once the store failed -------------------------------------------
    def _advance(self, reader: IO[bytes], offset: int) -> None:
        """`reader` has sent every byte before `offset`: memory it no longer needs can go."""
        if self._readers.was_cut(reader):
            raise FillAborted(f"fill of {self.key} from {self.url} is not being stored, and this client took "
                              f"nothing for {self._readers.patience:g}s while others waited for it")
        self._readers.advance(reader, offset)

    async def _spill(self, store: Store, error: StoreError) -> None:
        """The store cannot write: drop the temp file, carry on from memory."""
        self._readers.spilled_at = self.temp.written
        self._store_error = error
        log.warning("store_write_failed", key=self.key, url=self.url, on_disk=self._readers.spilled_at,
                    error=str(error))
        if self._on_unstored is not None:
            self._on_unstored()
        await self.writing.discard()  # readers keep their descriptors on the bytes written so far

    async def _take(self, store: Store, chunk: bytes) -> None:
        """Put one chunk where readers find it: the temp file, or memory once the store failed."""
        readers = self._readers
        if readers.spilled_at is None:
            before = self.temp.written
            try:
                await self.write(store.write(self.temp, chunk))
            except StoreError as e:
                await self._spill(store, e)
                kept = readers.spilled_at - before  # a write may have taken part of the chunk
                readers.memory.append((readers.spilled_at, chunk[kept:]))
        else:
            readers.memory.append((self._received, chunk))
        self._received += len(chunk)
        readers.trim()

    async def run(self, chunks: AsyncIterator[bytes], *, store: Store, meta: Meta,
                  on_bytes: Callable[[int], None] | None = None,
                  superseded: Callable[[], bool] = lambda: False, refused: NotStored | None = None) -> Meta:
        """Copy the origin body to disk, verify its length, commit it.

        Raises, after every client got the whole body: TooLarge when a body
        of unknown length turned out larger than the store's capacity,
        Unprovable for a body delimited by the connection closing,
        StoreUnwritable when the store could not write it, and Superseded
        when `superseded()` says a write made it obsolete; `refused`, the
        store's refusal already met (`AtOnce.store_whole`), is raised in place
        of a second commit, which would count a second miss in the policy.
        """
        async def receive() -> None:
            await self._stream(chunks, store=store, on_bytes=on_bytes)

        return await self._run(receive, store=store, meta=meta, superseded=superseded, refused=refused)

    async def run_spliced(self, body: "splice.SocketBody", *, store: Store, meta: Meta, read_timeout: float,
                          on_bytes: Callable[[int], None] | None = None, superseded: Callable[[], bool] = lambda: False,
                          rest: Callable[[int, BaseException], AsyncIterator[bytes]] | None = None,
                          broke: tuple[type[BaseException], ...] = ()) -> Meta:
        """`run`, with the kernel moving the body socket -> pipe -> file
        (cachenode/kernel/splice.py), as parallel ranges are: the one mechanism for
        every fill over plain TCP, from an origin or a peer. Once the store
        fails, the rest goes through memory as in `run`; once the socket
        fails (`broke`: the errors that say so), through `rest(offset, error)` if given."""
        async def receive() -> None:
            def moved(n: int) -> None:
                self.temp.written += n
                self._received += n
                self._arrived(n, on_bytes)

            try:
                if body.buffered:
                    await self._take(store, body.buffered)
                    self._arrived(len(body.buffered), on_bytes)
                if self._readers.spilled_at is None and body.remaining:
                    total = self.temp.written + body.remaining
                    try:
                        await store.pump_into(self.temp, body, self.temp.written, end=lambda: total, moved=moved,
                                              read_timeout=read_timeout, started=self.track)
                    except StoreError as e:
                        await self._spill(store, e)
                if self._readers.spilled_at is not None:
                    await self._stream(body.rest(read_timeout=read_timeout), store=store, on_bytes=on_bytes)
                return
            except broke as e:
                if rest is None:
                    raise
                error: BaseException = e
            finally:
                body.close()
            await self._stream(rest(self._received, error), store=store, on_bytes=on_bytes)

        return await self._run(receive, store=store, meta=meta, superseded=superseded)

    async def write(self, write: Awaitable[None]) -> None:
        """Await a write whose thread holds the temp file's descriptor; if the
        caller is cancelled it still runs to its end, and the fill waits for
        it before it closes the temp file."""
        await asyncio.shield(self.track(asyncio.ensure_future(write)))

    def track(self, job: asyncio.Future) -> asyncio.Future:
        """Wait for `job` (a thread writing the temp file) before closing the temp file."""
        self._writes.add(job)
        job.add_done_callback(self._writes.discard)
        return job

    async def writes_done(self) -> None:
        """Let writes still running in threads end before the temp file's
        descriptor is closed. asyncio.wait, not gather: a second cancel of
        the caller must not cancel them, or their descriptors would be
        closed under their threads."""
        if self._writes:
            await asyncio.wait(list(self._writes))

    def _arrived(self, n: int, on_bytes: Callable[[int], None] | None) -> None:
        if on_bytes:
            on_bytes(n)
        self._notify()

    async def run_ranged(self, fetch: Callable[["Fill"], Awaitable[None]],
                         fallback: Callable[[int], AsyncIterator[bytes]], *, store: Store, meta: Meta,
                         on_bytes: Callable[[int], None] | None = None,
                         superseded: Callable[[], bool] = lambda: False) -> Meta:
        """Like `run`, for a body that `fetch` writes in parallel ranges into
        their places in the temp file, reporting the contiguous prefix with
        `advance`. If `fetch` gives up (RangesAbandoned), the rest comes from
        `fallback(prefix)`, one plain stream of the bytes from `prefix` on,
        received as `run` receives a body (so a full disk still streams)."""
        async def receive() -> None:
            try:
                await fetch(self)
            except RangesAbandoned as e:
                # From here only the prefix counts: the plain stream rewrites what lies beyond it.
                self._ranges = None
                log.warning("parallel_fill_abandoned", key=self.key, url=self.url, at=self._received, reason=str(e))
                await self._stream(fallback(self._received), store=store, on_bytes=on_bytes)

        return await self._run(receive, store=store, meta=meta, superseded=superseded)

    def advance(self, prefix: int) -> None:
        """Bytes [0, prefix) are on disk, and maybe more beyond (`Ranges.covered_until`):
        written in place by a parallel fetch. Readers anywhere may go on."""
        if prefix > self._received:
            self._received = self.temp.written = prefix
        self._notify()

    async def _stream(self, chunks: AsyncIterator[bytes], *, store: Store,
                      on_bytes: Callable[[int], None] | None) -> None:
        async for chunk in chunks:
            if not chunk:
                continue
            await self._take(store, chunk)
            if on_bytes:
                on_bytes(len(chunk))
            self._notify()
            if self._readers.spilled_at is not None:
                await self._readers.wait_for_room(self._notify)

    async def _run(self, receive: Callable[[], Awaitable[None]], *, store: Store, meta: Meta,
                   superseded: Callable[[], bool], refused: NotStored | None = None) -> Meta:
        self.url = meta.url
        try:
            await receive()
            if self.length is not None and self.written != self.length:
                raise FillAborted(
                    f"origin {self.url} sent {self.written} of {self.length} bytes for {self.key}")
            if self._check is not None and self._readers.spilled_at is None:
                mismatch = await self._check.finish(self.written)
                if mismatch is not None:
                    raise DigestMismatch(f"{self.url} sent bytes for {self.key} that are not what it published: "
                                         f"{mismatch}; nothing is stored", mismatch=mismatch)
            self.complete = True
            self._notify()
            if self._readers.spilled_at is not None:
                raise StoreUnwritable(f"streamed {self.key} from memory: the store could not write it "
                                      f"({self._store_error})")
            if self.delimited_by_close:
                raise Unprovable(f"origin {self.url} sent {self.key} without Content-Length or chunked framing: "
                                 f"its {self.written} bytes end where the connection closed, which no one "
                                 f"can tell from a cut")
            if superseded():
                raise Superseded(f"a write to {self.url} succeeded while {self.key} was being fetched")
            if refused is not None:
                raise refused
            self.meta = await self.writing.commit(meta, expect=self._blocks)
            return self.meta
        except asyncio.CancelledError:
            self.error = FillAborted(f"fill of {self.key} from {self.url} was cancelled")
            await self.writes_done()
            await self.writing.discard()
            raise
        except Exception as e:
            self.error = e if isinstance(e, NezhaError) else FillAborted(
                f"reading the body of origin {self.url} for {self.key}: {type(e).__name__}: {e}")
            await self.writes_done()
            await self.writing.discard()
            if self.error is e:
                raise
            raise self.error from e
        finally:
            if self._check is not None:
                self._check.close()
            self._notify()
