"""The store's in-memory index: which responses are stored, what they weigh,
and which goes first when room is needed.

Apart from the store's files (`store/disk.py`) because it touches no disk:
the store asks it what to evict and does the unlinking itself, through the
`evicted` callback it hands over at construction. Everything here runs on
the event loop only, so it needs no lock.

Every stored response is one of three kinds of copy, each ordered by the
eviction policy (`store/policy.py`), and room is taken from them in this
order (docs/cache-node.md "Eviction"):

1. hot copies (`Meta.hot`): a cache of the cache, within the store's hot
   share; they go before anything else;
2. extra copies (`Meta.extra`): a replica this node holds though another
   node is the key's first owner; given up before the only copy of
   another object, so under pressure the tier's capacity goes to distinct
   objects;
3. only copies: the ones this node is the first owner of. A newcomer
   takes a victim's room only if the policy lets it displace the victim;
   otherwise the newcomer itself goes (reason `refused`).

A protected object (pinned by a workload: `protect`) stays in its kind's
order, its reads counted, but out of the walk eviction makes, and comes
back at the back of the walk when its protection ends: eviction looks at
a few rows however many are pinned (cachenode/store/rows.py `RowOrder.park`).

Usage counts the bytes stored and the bytes reserved by fills still
running. A reservation is made before the newcomer is known, so it evicts
only copies beyond a headroom of a tenth of the capacity: evicting for a
newcomer that may then be refused would give the subset up one object per
miss. At rest the store holds at most its capacity. The admission and the
evictions: cachenode/store/room.py.

Memory: a stored object is a row of compact arrays (cachenode/store/rows.py:
its slot's SHA-256, size, data file nonce, kind, policy state), not a
`Meta`. The rest of its record is read from its file when asked for
(`records`, given by the store) and checked to name the same slot, so a
hash collision never serves another object; the `recent` records read
last are kept (hot ones are read from memory, the others from the page
cache). Records the store cannot find again by their name are kept in
memory whole: responses that vary (their slots hold a variant, and a key's
variants are found from it), chunks (their object finds them by key), and
any record when no `records` is given (a unit test's index). How a row's
record is read back: cachenode/store/records.py. What a store answers from
the index alone (`IndexView`, importable from here): cachenode/store/index_view.py.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Callable

from cachenode.http.vary import variant as variant_of
from cachenode.store.census import Census
from cachenode.store.following import Following
from cachenode.store.objects import VARIANT_SEPARATOR, Meta
from cachenode.store.index_view import IndexView, Slots
from cachenode.store.policy import Candidate, Policy
from cachenode.store.records import SEALED_SUFFIX, Records, digest_of
from cachenode.store.room import Room, Usage, kind_of, kind_of_flags
from cachenode.store.rows import EMPTY, EXTRA, HOT, SEALED, RowOrder, Rows, hash_of
from nezha.chunks import chunk_of

KINDS = ("hot", "extra", "only")  # the kinds of copy, first to go first
REASONS = ("capacity", "extra_copy", "refused", "expired", "replaced")  # why an object left the store
RECENT = 4096  # records read from disk kept in memory, the last used
_MEMBER = {"hot": HOT, "extra": EXTRA, "only": 0}

__all__ = ["Index", "IndexView", "KINDS", "REASONS", "RECENT", "Slots", "Usage", "digest_of", "kind_of"]


class Index(Records, Following, Room):
    """slot -> stored object, in eviction order, with the bytes they and running fills hold.

    `evicted(meta, reason)` is called for each object an eviction drops,
    after it left the index: the store deletes its files and tells whoever
    listens. `records(oid, data)` reads the record of the object whose
    data file is `data` in folder `oid[:2]`; `lost(oid, data)` is told of
    an object whose record could no longer be read (deleted or damaged
    under the store): it left the index, its files should go.
    """

    def __init__(self, *, evicted: Callable[[Meta, str], None], census: Census | None = None,
                 protected: Callable[[str], bool] = lambda key: False,
                 named: Callable[[str], bool] | None = None,
                 ended: Callable[[int], int] = lambda limit: 0,
                 records: Callable[[str, str], Meta | None] | None = None,
                 lost: Callable[[str, str], None] = lambda oid, data: None, recent: int = RECENT) -> None:
        self._evicted = evicted
        # A key eviction passes over (pinned by a workload, say), asked of a committed newcomer no
        # victim can make room for (room.py `_next_victim`); it may end a protection past its time.
        self._protected = protected
        # The same question without that side effect, asked of each object added, whose row then
        # waits out of eviction's walk until `protect(key, False)`: an add may run inside the
        # protector's own call (Pins.held says why). The store gives both; `protected` stands in
        # for it only where no call of the protector adds objects (tests of eviction alone).
        self._named = named or protected
        self._ended = ended  # let at most so many protections whose time is over end; how many it looked at
        self._records = records
        self._lost = lost
        self.census = census or Census()
        self._rows = Rows()
        self._kept: dict[int, Meta] = {}  # row -> its record, for rows not read from disk (module docstring)
        self._recent: OrderedDict[int, Meta] = OrderedDict()  # row -> its record read last, least recent first
        self._recent_max = recent
        # key -> the slots of its stored variants (their records kept): a key that does not vary is its own slot.
        self._varying: dict[str, set[str]] = {}
        self._vary: dict[str, tuple[str, ...]] = {}  # key -> the names its newest response varies on
        # object key -> the keys of its chunks stored here (nezha/chunks.py): an
        # invalidated object's chunks are found without a manifest or a scan.
        self._chunks: dict[str, set[str]] = {}
        # A slot's hash is the int its row's order names it by already (`int`: no Python call per look).
        self._orders = {kind: RowOrder(self._rows, _MEMBER[kind]) for kind in KINDS}
        self.policies = {kind: Policy(hash_fn=int, order=self._orders[kind]) for kind in KINDS}
        self.usage = Usage()
        self.evictions: Counter[str] = Counter({reason: 0 for reason in REASONS})
        self.slots = Slots(self)
        # While the start-up scan runs in the background (store/loading.py): the
        # hashes of the slots dropped meanwhile, so that it adds none back, and how far it got.
        self.dropped: set[int] | None = None
        self.loaded = 1.0
        # Told of every change to the index, in order: ("put", meta) (a row added), ("load",
        # meta) (added by the start-up scan, `recent=False`), ("refresh", meta) (the same row's record
        # replaced: `replace`) and ("drop", meta). A node's other workers follow the index this way
        # (cachenode/workers/), since only this process writes the store.
        self.watchers: list[Callable[[str, Meta], None]] = []

    # -- reads -------------------------------------------------------------
    def lookup(self, key: str, request_headers=None) -> Meta | None:
        """The stored response for `key` that a request with `request_headers`
        selects (RFC 9111 §4.1), counted as a use. Without headers, only a
        response that does not vary: who does not say what it asks for gets no variant."""
        names = self._vary.get(key)
        if names is None:
            slot = key
        elif request_headers is None:
            return None
        else:
            slot = f"{key}{VARIANT_SEPARATOR}{variant_of(names, request_headers)}"
        row, meta = self._find(slot)
        if meta is not None:
            self._used(row, meta)
        return meta

    def _find(self, slot: str) -> tuple[int, Meta | None]:
        """(row, record) of `slot`; a row whose record is gone from disk is forgotten on the way."""
        row = self._rows.find(digest_of(slot))
        if row == EMPTY:
            return EMPTY, None
        meta = self._meta(row)
        if meta is None:
            self._forget(row)
            return EMPTY, None
        return (row, meta) if meta.slot == slot else (EMPTY, None)

    def get(self, slot: str) -> Meta | None:
        """The meta stored in `slot`, not counted as a use."""
        return self._find(slot)[1]

    def has(self, slot: str) -> bool:
        """Whether `slot` holds an object, from memory alone."""
        return self._rows.find(digest_of(slot)) != EMPTY

    def size_of(self, slot: str) -> int | None:
        """The bytes `slot` holds, from memory alone; None when it holds nothing."""
        row = self._rows.find(digest_of(slot))
        return None if row == EMPTY else self._rows.sizes[row]

    def was_dropped(self, slot: str) -> bool:
        """Whether `slot` was dropped since the start-up scan began (store/loading.py)."""
        return self.dropped is not None and hash_of(digest_of(slot)) in self.dropped

    def varies(self, key: str) -> bool:
        """Whether responses that vary are stored for `key`, from memory alone."""
        return key in self._varying

    def vary_of(self, key: str) -> tuple[str, ...] | None:
        """The names `key`'s newest stored response varies on; None when it does not vary (or nothing is stored)."""
        return self._vary.get(key)

    def touch(self, slot: str) -> None:
        """A read of `slot` served elsewhere (another worker) counts as a use."""
        row, meta = self._find(slot)
        if meta is not None:
            self._used(row, meta)

    def _used(self, row: int, meta: Meta) -> None:
        rows = self._rows
        kind = kind_of_flags(rows.flags[row])
        self.census.read(kind, rows.sizes[row], self.policies[kind].hit(rows.hashes[row]), hit=True)

    def chunks_of(self, key: str) -> list[str]:
        return sorted(self._chunks.get(key, ()))

    def slots_of(self, key: str) -> list[str]:
        """The slots `key` is stored in: one, one per stored variant, or none."""
        own = [key] if self.has(key) else []
        return own + list(self._varying.get(key, ()))

    def metas(self) -> list[Meta]:
        """Every stored response, variants included: the records of objects on disk are read."""
        out = []
        for row in list(self._rows.used()):
            meta = self._meta(row)
            if meta is None:
                self._forget(row)
            else:
                out.append(meta)
        return out

    def __len__(self) -> int:
        return self._rows.count

    # -- changes -----------------------------------------------------------
    def candidate(self, meta: Meta) -> Candidate:
        """What `arrived` would record of `meta`, recorded nowhere: a newcomer judged before its write may fail."""
        return self.policies[kind_of(meta)].candidate(hash_of(digest_of(meta.slot)))

    def arrived(self, meta: Meta) -> None:
        """A newcomer the store kept or refused (not one whose write failed): a miss, as its kind's policy has it."""
        self._arrived(kind_of(meta), meta.size, hash_of(digest_of(meta.slot)))

    def _arrived(self, kind: str, size: int, h: int) -> None:
        self.census.read(kind, size, self.policies[kind].missed_gap(h)[1], hit=False)

    def add(self, meta: Meta, *, recent: bool = True) -> None:
        """`meta` stored in its slot, which holds nothing yet (a commit drops what it replaces first).
        `recent`: keep its record among those read last (a commit's, soon read;
        not the start-up scan's million, read when asked)."""
        digest = digest_of(slot := meta.slot)
        rows = self._rows
        other = rows.holder(digest)
        if other != EMPTY and rows.digest(other) == digest:
            self.drop(slot)  # already held: the caller meant a replacement
        elif other != EMPTY:  # 64 bits of hash alike, another slot: the newcomer takes its row
            self._evict(other, "replaced")
        self._add(meta, slot, digest, kind_of(meta), recent)

    def add_new(self, meta: Meta) -> bool:
        """`arrived` and `add` of `meta` at once when nothing of its key is held
        and it does not vary (a cold fill's newcomer): nothing to drop or
        replace, no Vary to note, its slot hashed and its kind found once.
        False, and nothing done, for any other: the store's general way."""
        key = meta.key
        if meta.vary or key in self._vary or key in self._varying:
            return False
        digest = digest_of(key)
        if self._rows.holder(digest) != EMPTY:
            return False
        kind = kind_of(meta)
        self._arrived(kind, meta.size, hash_of(digest))
        self._add(meta, key, digest, kind, True)
        return True

    def _add(self, meta: Meta, slot: str, digest: bytes, kind: str, recent: bool) -> None:
        """`add` once no row holds `digest`'s hash (`slot`'s, `meta`'s; `kind` its kind)."""
        rows = self._rows
        chunk = chunk_of(meta.key)
        nonce = self._nonce(meta, digest, chunk)
        flags = _MEMBER[kind] | (SEALED if meta.data.endswith(SEALED_SUFFIX) else 0)
        row = rows.new(digest, size=meta.size, nonce=nonce, flags=flags)
        if nonce == EMPTY:
            self._kept[row] = meta
        elif recent:
            self._remember(row, meta)
        for watch in self.watchers:
            watch("put" if recent else "load", meta)
        self._held(row, kind, meta.size)
        if self._named(meta.key):
            self._orders[kind].park(rows.hashes[row])
        if meta.vary:
            self._varying.setdefault(meta.key, set()).add(slot)
        if chunk is not None:
            self._chunks.setdefault(chunk[0], set()).add(meta.key)
        if meta.vary:
            self._vary[meta.key] = meta.vary
        else:
            self._vary.pop(meta.key, None)

    def _held(self, row: int, kind: str, size: int, *, ordered: bool = True) -> None:
        """Row `row`'s bytes into the usage, and (`ordered`) the row into its kind's order, most recently used."""
        u = self.usage
        u.stored += size
        if ordered:
            self.policies[kind].add(self._rows.hashes[row])
        if kind == "hot":
            u.hot += size
        elif kind == "extra":
            u.extra += size

    def protect(self, key: str, held: bool) -> None:
        """`key` protected from now (`held`: its objects leave the walk eviction makes) or no longer
        (they come back at its end, as a walk that met them would have put them): its slot and its variants'."""
        rows = self._rows
        for slot in (key, *self._varying.get(key, ())):
            row = rows.find(digest_of(slot))
            if row != EMPTY:
                order = self._orders[kind_of_flags(rows.flags[row])]
                (order.park if held else order.unpark)(rows.hashes[row])

    def replace(self, new: Meta) -> None:
        """`new` in place of the meta in its slot (same bytes and kind: a refresh), keeping its place in the order."""
        row = self._rows.find(digest_of(new.slot))
        if row == EMPTY:
            return
        if row in self._kept:
            self._kept[row] = new
        else:
            self._remember(row, new)
        for watch in self.watchers:
            watch("refresh", new)

    def drop(self, slot: str, *, reason: str | None = None) -> Meta | None:
        """Forget `slot`; `reason` counts it among the evictions (REASONS)."""
        row = self._rows.find(digest_of(slot))
        if row == EMPTY:
            return None
        meta = self._meta(row)
        if meta is None:
            self._forget(row, reason=reason)
            return None
        self._release(row)
        for watch in self.watchers:
            watch("drop", meta)
        if reason is not None:
            self.evictions[reason] += 1
        key = meta.key
        if (variants := self._varying.get(key)) is not None:
            variants.discard(slot)
            if not variants:
                del self._varying[key]
        if not self.slots_of(key):
            self._vary.pop(key, None)
            if (chunk := chunk_of(key)) is not None and (chunks := self._chunks.get(chunk[0])) is not None:
                chunks.discard(key)
                if not chunks:
                    del self._chunks[chunk[0]]
        return meta

    def _release(self, row: int) -> None:
        """Row `row` out of its order, its bytes out of the usage, the row free."""
        rows = self._rows
        h, size, kind = rows.hashes[row], rows.sizes[row], kind_of_flags(rows.flags[row])
        self.policies[kind].remove(h)
        self.usage.stored -= size
        if kind == "hot":
            self.usage.hot -= size
        elif kind == "extra":
            self.usage.extra -= size
        self._kept.pop(row, None)
        self._recent.pop(row, None)
        if self.dropped is not None:
            self.dropped.add(h)
        rows.free(row)

    def _forget(self, row: int, *, reason: str | None = None) -> None:
        """A row whose record is no longer on disk (deleted or damaged under the store): out, its files to go."""
        oid, data = self._rows.digest(row).hex(), self._data(row)
        self._release(row)
        if reason is not None:
            self.evictions[reason] += 1
        self._lost(oid, data)

    def by_kind(self) -> dict[str, int]:
        """Bytes stored as each kind of copy."""
        u = self.usage
        return {"only": u.stored - u.hot - u.extra, "extra": u.extra, "hot": u.hot}
