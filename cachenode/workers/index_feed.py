"""The store's index as the followers get it: the whole of it when one joins,
in slices the primary's event loop hardly notices, then every change in order.

A node holding a million objects has a million rows. Sending each as its
record would read a million files and encode a million `Meta`s on the
primary's loop, stalling its serving for as long, and hold them all in
memory while the link drains. So a join sends the rows themselves (`Rows`,
slices of the index's arrays: no record read, about 50 bytes an object,
cachenode/store/following.py), a record only for the few objects whose
record lives in memory alone (variants, chunks), and yields to the loop
after each slice, waiting while the link holds more than a few records.

The same holds for the start-up scan of a restarted node: what it loads
("load" events, a folder's objects at a time) goes as rows, gathered until
the loop turns; any other change first sends the rows gathered before it,
so the link stays in order.

And for every object the node stores ("put": a row added): a burst of
small cold fills is one change per fill, all of them the primary's, and a
record each (the Meta made a dict, measured for size and encoded as JSON,
one send per fill) was 12% of the primary's samples in a profile of cold
16 KiB fills and cost the follower 45 to 150 us a fill to decode and apply
(docs/benchmarks.md, "Small files through the node as shipped"). A row is
50 bytes, packed with the others of the same loop turn; the follower reads
the record from the object's file on its first hit, as after a join. A record
changed in place ("refresh": a 304's new headers and expiry, the same row
and file) still goes as a record: the follower may hold the old one in
memory, and a row the same as the one it holds changes nothing there.

Changes made while a join runs go to the joining link as to the others; a
slice is packed when it is sent, so it holds the index as it is at that
point of the link's stream, and a follower applying the stream in order
ends with the primary's index (module docstring of store/following.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import fields

import structlog

from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from cachenode.store.rows import EMPTY, PACKED_ROW
from cachenode.store.small import record_of
from cachenode.workers.channel import MAX_RECORD, Channel
from cachenode.workers.messages import Drop, Put, Rows, Synced

log = structlog.get_logger("nezha.workers")

ROWS_PER_RECORD = (MAX_RECORD - 1024) // PACKED_ROW
METAS_PER_SLICE = 256  # records kept whole, sent per slice of a join
QUEUED = 8  # records a joining link may hold before the join waits for it to drain


_META_FIELDS = frozenset(f.name for f in fields(Meta))


def meta_from(raw: dict) -> Meta:
    """A `Meta` from its record on a link (`meta_records`, `LeadDone`): fields this version does not know are left out."""
    return Meta(**{k: v for k, v in raw.items() if k in _META_FIELDS})


def meta_records(metas: list[Meta], event: str) -> list[Put | Drop]:
    """`metas` as records of at most MAX_RECORD bytes each, Put or Drop as the
    store's `event` ("put", "drop") says. A meta too large for any record goes
    as a Drop: the follower then hands its requests here, which is slower and
    still exact."""
    kind = Put if event == "put" else Drop
    records: list[Put | Drop] = []
    batch: list[dict] = []
    size = 0
    for meta in metas:
        raw = record_of(meta)  # shallow: every value is immutable, and JSON writes a tuple as a list
        n = len(json.dumps(raw, separators=(",", ":")))
        if n > MAX_RECORD - 256:
            records.append(Drop(metas=[raw | {"headers": []}]))
            continue
        if batch and size + n > MAX_RECORD - 256:
            records.append(kind(metas=batch))
            batch, size = [], 0
        batch.append(raw)
        size += n + 1
    if batch:
        records.append(kind(metas=batch))
    return records


class IndexFeed:
    """Sends the store's index to the follower links in `links` (worker -> link)."""

    def __init__(self, store: Store, links: dict[int, Channel]) -> None:
        self.store = store
        self.links = links
        self._added: list[int] = []  # rows added (stored, or loaded by the start-up scan), not sent yet
        self._flushing: asyncio.Handle | None = None
        self._joins: set[asyncio.Task] = set()

    def join(self, worker: int, link: Channel) -> asyncio.Task:
        """Send the whole index to `link`, then Synced, in the background."""
        self._send_added()  # rows gathered before the join go to the others first
        task = asyncio.get_running_loop().create_task(self._join(worker, link))
        self._joins.add(task)
        task.add_done_callback(self._joins.discard)
        return task

    async def _join(self, worker: int, link: Channel) -> None:
        index = self.store.index
        loop = asyncio.get_running_loop()
        started, records = loop.time(), 0
        start = 0
        while start < index.row_span:  # read again each time: rows added meanwhile are sent too
            n, packed = index.packed(start, ROWS_PER_RECORD)
            link.send(Rows(n=n), packed)
            start += n
            records += 1
            if not await _room(link):
                return
        kept = index.kept_rows()
        for at in range(0, len(kept), METAS_PER_SLICE):
            metas = [m for row in kept[at:at + METAS_PER_SLICE] if (m := index.kept(row)) is not None]
            for record in meta_records(metas, "put"):
                link.send(record)
                records += 1
            if not await _room(link):
                return
        link.send(Synced())
        log.info("worker_joined", worker=worker, objects=len(self.store), records=records,
                 seconds=round(loop.time() - started, 3))

    def changed(self, event: str, meta: Meta) -> None:
        """One change to the index (`Store.watchers`), to every link."""
        if not self.links:
            return
        index = self.store.index
        if event in ("load", "put") and (row := index.row_of(meta.slot)) != EMPTY:
            self._added.append(row)
            if len(self._added) >= ROWS_PER_RECORD:
                self._send_added()
            elif self._flushing is None:
                self._flushing = asyncio.get_running_loop().call_soon(self._send_added)
            return
        self._send_added()
        for record in meta_records([meta], "drop" if event == "drop" else "put"):
            for link in self.links.values():
                link.send(record)

    def _send_added(self) -> None:
        """The rows added, as they are now: any change to one since came after its addition."""
        if self._flushing is not None:
            self._flushing.cancel()
            self._flushing = None
        if not self._added:
            return
        rows, self._added = self._added, []
        packed = self.store.index.packed_rows(rows)
        for link in self.links.values():
            link.send(Rows(n=len(rows)), packed)

    def close(self) -> None:
        for task in list(self._joins):
            task.cancel()
        if self._flushing is not None:
            self._flushing.cancel()
            self._flushing = None


async def _room(link: Channel) -> bool:
    """Yield to the loop, then wait while `link` holds more than a few records; False once it closed."""
    await asyncio.sleep(0)
    while link.queued > QUEUED and not link.closed:
        await asyncio.sleep(0.002)
    return not link.closed

