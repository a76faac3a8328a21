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

Usage counts the bytes stored and the bytes reserved by fills still
running. A reservation is made before the newcomer is known, so it evicts
only copies beyond a headroom of a tenth of the capacity: evicting for a
newcomer that may then be refused would give the subset up one object per
miss. At rest the store holds at most its capacity.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from cachenode.http.vary import variant as variant_of
from cachenode.store.census import Census
from cachenode.store.objects import VARIANT_SEPARATOR, Meta
from cachenode.store.policy import Candidate, Policy
from nezha.chunks import chunk_of

KINDS = ("hot", "extra", "only")  # the kinds of copy, first to go first
REASONS = ("capacity", "extra_copy", "refused", "expired", "replaced")  # why an object left the store


def kind_of(meta: Meta) -> str:
    return "hot" if meta.hot else "extra" if meta.extra else "only"


@dataclass
class Usage:
    stored: int = 0
    reserved: int = 0
    hot: int = 0  # of `stored`, bytes of hot copies
    extra: int = 0  # of `stored`, bytes of extra copies


class Index:
    """slot -> Meta, in eviction order, with the bytes they and running fills hold.

    `evicted(meta, reason)` is called for each object an eviction drops,
    after it left the index: the store deletes its files and tells whoever
    listens.
    """

    def __init__(self, *, evicted: Callable[[Meta, str], None], census: Census | None = None,
                 protected: Callable[[str], bool] = lambda key: False) -> None:
        self._evicted = evicted
        self._protected = protected  # a key eviction passes over (pinned by a workload, say)
        self.census = census or Census()
        # slot -> meta; the order of eviction is the policies' (one per kind of copy).
        self.entries: dict[str, Meta] = {}
        # key -> its slot, or the set of its slots when it has several stored variants:
        # one string, not a set of one, for the million objects that do not vary.
        self.slots: dict[str, str | set[str]] = {}
        self._vary: dict[str, tuple[str, ...]] = {}  # key -> the names its newest response varies on
        # object key -> the keys of its chunks stored here (nezha/chunks.py): an
        # invalidated object's chunks are found without a manifest or a scan.
        self._chunks: dict[str, set[str]] = {}
        self.policies = {kind: Policy() for kind in KINDS}
        self.usage = Usage()
        self.evictions: Counter[str] = Counter({reason: 0 for reason in REASONS})
        # While the start-up scan runs in the background (store/loading.py): the slots
        # dropped meanwhile, so that it adds none back, and how far it got.
        self.dropped: set[str] | None = None
        self.loaded = 1.0
        # Told of every change to the index, in order: ("put", meta) and
        # ("drop", meta). A node's other workers follow the index this way
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
        meta = self.entries.get(slot)
        if meta is not None:
            self._used(slot, meta)
        return meta

    def get(self, slot: str) -> Meta | None:
        """The meta stored in `slot`, not counted as a use."""
        return self.entries.get(slot)

    def touch(self, slot: str) -> None:
        """A read of `slot` served elsewhere (another worker) counts as a use."""
        meta = self.entries.get(slot)
        if meta is not None:
            self._used(slot, meta)

    def _used(self, slot: str, meta: Meta) -> None:
        kind = kind_of(meta)
        self.census.read(kind, meta.size, self.policies[kind].hit(slot), hit=True)

    def chunks_of(self, key: str) -> list[str]:
        return sorted(self._chunks.get(key, ()))

    def slots_of(self, key: str) -> list[str]:
        """The slots `key` is stored in: one, one per stored variant, or none."""
        held = self.slots.get(key)
        return [] if held is None else [held] if isinstance(held, str) else list(held)

    def __len__(self) -> int:
        return len(self.entries)

    # -- changes -----------------------------------------------------------
    def arrived(self, meta: Meta) -> Candidate:
        """A newcomer about to be added by a commit: a miss, as its kind's policy records it."""
        kind = kind_of(meta)
        candidate = self.policies[kind].missed(meta.slot)
        self.census.read(kind, meta.size, candidate.gap, hit=False)
        return candidate

    def add(self, meta: Meta) -> None:
        self.entries[meta.slot] = meta
        for watch in self.watchers:
            watch("put", meta)
        self.usage.stored += meta.size
        kind = kind_of(meta)
        self.policies[kind].add(meta.slot)
        if kind == "hot":
            self.usage.hot += meta.size
        elif kind == "extra":
            self.usage.extra += meta.size
        held = self.slots.get(meta.key)
        if held is None or held == meta.slot:
            self.slots[meta.key] = meta.slot
        elif isinstance(held, set):
            held.add(meta.slot)
        else:
            self.slots[meta.key] = {held, meta.slot}
        if (chunk := chunk_of(meta.key)) is not None:
            self._chunks.setdefault(chunk[0], set()).add(meta.key)
        if meta.vary:
            self._vary[meta.key] = meta.vary
        else:
            self._vary.pop(meta.key, None)

    def replace(self, new: Meta) -> None:
        """`new` in place of the meta in its slot (same bytes and kind: a refresh), keeping its place in the order."""
        self.entries[new.slot] = new
        for watch in self.watchers:
            watch("put", new)

    def drop(self, slot: str, *, reason: str | None = None) -> Meta | None:
        """Forget `slot`; `reason` counts it among the evictions (REASONS)."""
        meta = self.entries.pop(slot, None)
        if meta is None:
            return None
        if self.dropped is not None:
            self.dropped.add(slot)
        for watch in self.watchers:
            watch("drop", meta)
        self.usage.stored -= meta.size
        kind = kind_of(meta)
        self.policies[kind].remove(slot)
        if kind == "hot":
            self.usage.hot -= meta.size
        elif kind == "extra":
            self.usage.extra -= meta.size
        if reason is not None:
            self.evictions[reason] += 1
        held = self.slots.get(meta.key)
        if isinstance(held, set):
            held.discard(slot)
            if len(held) == 1:
                self.slots[meta.key] = next(iter(held))
        elif held == slot:
            del self.slots[meta.key]
            self._vary.pop(meta.key, None)
            if (chunk := chunk_of(meta.key)) is not None and (chunks := self._chunks.get(chunk[0])) is not None:
                chunks.discard(meta.key)
                if not chunks:
                    del self._chunks[chunk[0]]
        return meta

    # -- room ----------------------------------------------------------------
    def reserve(self, size: int) -> None:
        self.usage.reserved += size

    def release(self, size: int) -> None:
        self.usage.reserved = max(0, self.usage.reserved - size)

    def admits(self, meta: Meta, candidate: Candidate, limit: int, *, reserved_here: int = 0) -> bool:
        """Is `meta` kept when committed? Yes if it fits without giving up an
        only copy (hot and extra copies go first); else only an only copy
        may, and only if the policy lets it displace the victim."""
        u = self.usage
        freed = 0
        if (old := self.entries.get(meta.slot)) is not None and kind_of(old) == "only":
            freed = old.size
        others = max(0, u.reserved - reserved_here - limit // 10)
        room = limit - (u.stored - u.hot - u.extra - freed) - others
        if meta.size <= room:
            return True
        only = self.policies["only"]
        if kind_of(meta) == "only":
            victim = next(self._candidates("only", meta.slot), None)
            if victim is not None and only.displaces(candidate, victim):
                return True
        self.evictions["refused"] += 1
        return False

    def evict_to(self, limit: int, *, keep: str | None = None, candidate: Candidate | None = None) -> None:
        """Evict until what is stored fits `limit`, reservations beyond a tenth of it included.

        `keep` (the object just committed, `candidate` as `arrived` saw it)
        goes last among its kind: an only copy displaces a victim only if
        the policy says so, else it is itself refused; an extra copy never
        displaces an only copy. It survives alone only while its own bytes
        fit: the reservations of fills still running may leave the total
        above the limit until they commit and evict in turn.
        """
        headroom = limit // 10
        while self._over(limit, headroom) and self.entries:
            slot, reason = self._next_victim(limit, keep, candidate)
            if slot is None:
                break
            self._evict(slot, reason)

    def _candidates(self, kind: str, keep: str | None):
        """The slots of `kind` that may go, first to go first: neither `keep` nor protected."""
        entries, protected = self.entries, self._protected
        return (s for s in self.policies[kind].victims() if s != keep and not protected(entries[s].key))

    def _over(self, limit: int, headroom: int) -> bool:
        u = self.usage
        return u.stored + max(0, u.reserved - headroom) > limit

    def _next_victim(self, limit: int, keep: str | None, candidate: Candidate | None) -> tuple[str | None, str]:
        """The slot that goes next, and why; None when nothing should."""
        for kind in ("hot", "extra"):
            slot = next(self._candidates(kind, keep), None)
            if slot is not None:
                return slot, "extra_copy"
        only = self.policies["only"]
        victim = next(self._candidates("only", keep), None)
        if keep is None or keep not in self.entries:
            return victim, "capacity"
        if keep not in only:
            return keep, "refused"
        if victim is None:
            if self.usage.stored <= limit or self._protected(self.entries[keep].key):
                return None, ""
            return keep, "refused"
        if candidate is None or only.displaces(candidate, victim):
            return victim, "capacity"
        return keep, "refused"

    def evict_hot_to(self, limit: int, *, keep: str | None = None) -> None:
        """Evict hot copies, first to go first, until theirs fit `limit`; `keep` last."""
        hot = self.policies["hot"]
        while self.usage.hot > limit and len(hot):
            slot = next(self._candidates("hot", keep), None)
            if slot is None:
                break
            self._evict(slot, "extra_copy")

    def _evict(self, slot: str, reason: str) -> None:
        meta = self.drop(slot, reason=reason)
        assert meta is not None
        self._evicted(meta, reason)

    def by_kind(self) -> dict[str, int]:
        """Bytes stored as each kind of copy."""
        u = self.usage
        return {"only": u.stored - u.hot - u.extra, "extra": u.extra, "hot": u.hot}


class IndexView:
    """What a store answers from its index alone (cachenode/store/disk.py `Store`)."""

    _index: Index

    def __contains__(self, key: str) -> bool:
        return key in self._index.slots

    def keys(self) -> list[str]:
        return list(self._index.slots)

    def stored_size(self, key: str) -> int | None:
        """The bytes `key`'s stored responses hold here (all its variants); None when none is stored."""
        metas = [m for m in map(self._index.get, self._index.slots_of(key)) if m is not None]
        return sum(m.size for m in metas) if metas else None

    def chunks_of(self, key: str) -> list[str]:
        """The keys of the chunks of the object `key` stored here, of any chunk size or version."""
        return self._index.chunks_of(key)

    def metas(self) -> list[Meta]:
        """Every stored response, variants included."""
        return list(self._index.entries.values())

    @property
    def used_bytes(self) -> int:
        return self._index.usage.stored

    @property
    def hot_bytes(self) -> int:
        """Bytes of hot copies stored (part of `used_bytes`)."""
        return self._index.usage.hot

    @property
    def _usage(self):
        return self._index.usage

    def __len__(self) -> int:
        return len(self._index)

    def touch(self, slot: str) -> None:
        """A read of `slot` served elsewhere (another worker) counts as a use."""
        self._index.touch(slot)
