"""Room in the store's index: the bytes stored and reserved, whether a
newcomer is kept, and what is evicted to make room for it, kind of copy by
kind (cachenode/store/index.py's docstring says in which order and why).

Apart from the index because it is what the index decides with its rows
and policies, not how it keeps them: a mixin of `Index`, which owns them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from cachenode.store.objects import VARIANT_SEPARATOR, Meta
from cachenode.store.policy import Candidate, Policy
from cachenode.store.rows import EMPTY, EXTRA, HOT, RowOrder, Rows, digest_of, hash_of

# Protections whose time is over (pins released and kept their time) let end per look for a victim:
# a workload's million pins, released at once, end over the puts that follow, not within one.
ENDS_PER_LOOK = 64


def kind_of(meta: Meta) -> str:
    return "hot" if meta.hot else "extra" if meta.extra else "only"


def kind_of_flags(flags: int) -> str:
    """`kind_of` of a row by its flags, as the index keeps them (cachenode/store/rows.py)."""
    return "hot" if flags & HOT else "extra" if flags & EXTRA else "only"


@dataclass
class Usage:
    stored: int = 0
    reserved: int = 0
    hot: int = 0  # of `stored`, bytes of hot copies
    extra: int = 0  # of `stored`, bytes of extra copies


class Room:
    """Needs of the class it is mixed into (`Index`): `usage`, `_rows`,
    `policies`, `_orders`, `evictions`, `_protected`, `_ended`, `_evicted`, and its
    `has`, `drop`, `_meta`, `_forget`, `__len__`."""

    usage: Usage
    _rows: Rows
    policies: dict[str, Policy]
    _orders: dict[str, RowOrder]
    evictions: Counter[str]
    _protected: Callable[[str], bool]
    _ended: Callable[[int], int]
    _evicted: Callable[[Meta, str], None]

    def reserve(self, size: int) -> None:
        self.usage.reserved += size

    def release(self, size: int) -> None:
        self.usage.reserved = max(0, self.usage.reserved - size)

    def admits(self, meta: Meta, candidate: Candidate | None, limit: int, *, reserved_here: int = 0) -> bool:
        """Is `meta` kept when committed? Yes if it fits without giving up an
        only copy (hot and extra copies go first); else only an only copy
        may, and only if the policy lets it displace the victim. `candidate`
        None: worked out only if a victim is weighed (a newcomer that fits needs none)."""
        u = self.usage
        freed = 0
        digest = digest_of(meta.slot)
        rows = self._rows
        if (old := rows.find(digest)) != EMPTY and kind_of_flags(rows.flags[old]) == "only":
            freed = rows.sizes[old]
        others = max(0, u.reserved - reserved_here - limit // 10)
        room = limit - (u.stored - u.hot - u.extra - freed) - others
        if meta.size <= room:
            return True
        only = self.policies["only"]
        if kind_of(meta) == "only":
            h = hash_of(digest)
            self._ended(ENDS_PER_LOOK)
            victim = self._victim("only", h)
            if victim is not None and only.displaces(candidate if candidate else only.candidate(h), victim):
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
        while self._over(limit, headroom) and len(self):
            victim, reason = self._next_victim(limit, keep, candidate)
            if victim is None:
                break
            self._evict(self._rows.table.find(victim), reason)

    def _victim(self, kind: str, keep: int | None) -> int | None:
        """The hash of the slot of `kind` that goes first, not `keep`; None when none may.
        Protected ones are out of the order's walk (`Index.protect`): it looks at two
        rows at most, however many are protected. When none is left, protections that
        ended and are not let go yet (`ENDS_PER_LOOK` a look) go, one at a time, until one
        brings back a row of `kind` (at their end of the order, where the walk meets them)
        or none is due: ends that bring nothing back (a key dropped since, a pin renewed)
        do not stop it while a due one could. Each end is let go once, so what this costs
        is paid once per pin, not per look; and none is let go for a kind none of whose
        rows waits (nothing it could bring back)."""
        policy, order = self.policies[kind], self._orders[kind]
        while True:
            for h in policy.victims():
                if h != keep:
                    return h
            if order.parked == EMPTY or not self._ended(1):
                return None

    def _over(self, limit: int, headroom: int, more: int = 0) -> bool:
        u = self.usage
        return u.stored + max(0, u.reserved + more - headroom) > limit

    def room_for(self, size: int, limit: int) -> bool:
        """Whether `reserve(size)` would leave `evict_to(limit)` nothing to evict."""
        return not self._over(limit, limit // 10, size)

    def _next_victim(self, limit: int, keep: str | None, candidate: Candidate | None) -> tuple[int | None, str]:
        """The hash of the slot that goes next, and why; None when nothing should."""
        kept = None if keep is None else hash_of(digest_of(keep))
        self._ended(ENDS_PER_LOOK)
        for kind in ("hot", "extra"):
            h = self._victim(kind, kept)
            if h is not None:
                return h, "extra_copy"
        only = self.policies["only"]
        victim = self._victim("only", kept)
        if keep is None or not self.has(keep):
            return victim, "capacity"
        if kept not in only:
            return kept, "refused"
        if victim is None:
            if self.usage.stored <= limit or self._protected(keep.split(VARIANT_SEPARATOR, 1)[0]):
                return None, ""
            return kept, "refused"
        if candidate is None or only.displaces(candidate, victim):
            return victim, "capacity"
        return kept, "refused"

    def evict_hot_to(self, limit: int, *, keep: str | None = None) -> None:
        """Evict hot copies, first to go first, until theirs fit `limit`; `keep` last."""
        hot = self.policies["hot"]
        kept = None if keep is None else hash_of(digest_of(keep))
        while self.usage.hot > limit and len(hot):
            self._ended(ENDS_PER_LOOK)
            h = self._victim("hot", kept)
            if h is None:
                break
            self._evict(self._rows.table.find(h), "extra_copy")

    def _evict(self, row: int, reason: str) -> None:
        meta = self._meta(row)
        if meta is None:
            self._forget(row, reason=reason)
            return
        dropped = self.drop(meta.slot, reason=reason)
        assert dropped is not None
        self._evicted(dropped, reason)
