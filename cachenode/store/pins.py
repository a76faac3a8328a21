"""Objects kept from eviction for the workloads that prefetched them (docs/controller.md, "Kept while used").

The controller pins what a workload's prefetch stored, on the node that
stores it (`POST /_nezha/pins`: cachenode/cluster/pinning.py), while the
workload exists, and releases it when the workload is deleted: the pins
then hold for the workload's `nezha.io/prefetch-keep` more seconds. The
store's index keeps a held object out of the walk its evictions make
(cachenode/store/index.py): it is told (`on_hold`) when a key starts to be
held and when it stops, and asks `held(key)` of an object it adds.

Pins may hold at most `capacity` bytes of this node (`--pinned-share` of
its capacity): an epoch's scan of a dataset larger than the node must still
find room, and a node full of pins could store nothing else. A pin that
does not fit is refused, and the answer says how many bytes did and how
many more would have fit. An object pinned by several workloads counts
once.

Pins outlive the node's process: every change is told to `changed` (the
store writes them to its data directory, cachenode/store/pins_file.py), and
a node that starts `restore`s them before it loads its objects, so none of
them is evicted by the start-up's fit to capacity and a node restarted while
a workload runs keeps its objects without the controller asking again. The
clock is the wall clock for that reason: a pin's end survives a restart.

What a pin call costs is what its own keys cost, however many objects are
pinned (a prefetch of a million-file dataset pins them a batch at a time):
the bytes held are a running sum, each object counted at its size when it
was last pinned (a pinned object replaced by a larger version counts its
new size once pinned again); pins that end leave it through a heap of their
ends; a workload's keys are found without a walk over every pin. A pin
whose time is over ends when it is next asked of, counted (`used`), or
when the index, looking for a victim, lets a few go (`expire`): a million
pins released at once must not all end within one put.

No I/O: the store's sizes come through `size_of`, time through `clock`.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pinned:
    """What one pin request did: objects and bytes pinned, refused for the share, not stored here."""

    pinned: int = 0
    pinned_bytes: int = 0
    refused: int = 0
    refused_bytes: int = 0
    missing: int = 0
    room: int | None = None  # bytes still free for pins after this request; None: no bound


class Pins:
    def __init__(self, *, capacity: int | None, size_of: Callable[[str], int | None],
                 clock: Callable[[], float] = time.time, changed: Callable[[], None] = lambda: None,
                 on_hold: Callable[[str, bool], None] = lambda key, held: None) -> None:
        self.capacity = capacity
        self._size_of = size_of
        self._clock = clock
        self._changed = changed  # told after every pin and release: the store saves the pins
        # Told that a key is held from now (True) or no longer (False): the index parks its objects.
        self.on_hold = on_hold
        self._until: dict[str, dict[str, float | None]] = {}  # key -> workload -> until (None: while it exists)
        # What keeps a pin call's cost to the keys it names, however many are pinned:
        self._keys_of: dict[str, set[str]] = {}  # workload -> the keys it pins
        self._ends: list[tuple[float, str, str]] = []  # (until, key, workload), soonest first: pins that end
        self._sizes: dict[str, int] = {}  # key -> the bytes counted for it: its size when last pinned
        self._unmeasured: set[str] = set()  # keys restored and not measured yet (the store may still be loading)
        self._used = 0  # the sum of `_sizes`

    def holds(self, key: str) -> bool:
        """Whether `key` is kept from eviction now; a pin past its time is dropped on the way."""
        pins = self._until.get(key)
        if not pins:
            return False
        now = self._clock()
        for workload, until in list(pins.items()):
            if until is not None and until <= now:
                self._unpin(key, workload)
        return key in self._until

    def held(self, key: str) -> bool:
        """Whether a pin names `key`, its time over or not; nothing ends on the way. What the index
        asks of an object it adds: an add runs inside a pin call that measures a key while the store
        loads (`used`: the size asked loads it), where ending a pin would change what that call walks.
        A pin past its time is ended later (`expire`, `holds`), and its object then comes back."""
        return key in self._until

    def used(self) -> int:
        """Bytes held by pins now (an object pinned twice counts once), each at its size when last pinned:
        a running sum, so a pin call costs what its own keys do."""
        self.expire(len(self._ends))  # every pin whose time is over ends: its bytes are not held
        for key in list(self._unmeasured):
            size = self._size_of(key) or 0  # may load the key, while the store loads
            if key in self._unmeasured:  # still pinned, and not measured meanwhile
                self._unmeasured.discard(key)
                self._sizes[key] = size
                self._used += size
        return self._used

    def expire(self, limit: int) -> int:
        """End at most `limit` pins whose time is over, soonest first; how many ends it looked at
        (0: none was due). What one eviction lets end, however many ended at once."""
        ends = self._ends
        if not ends or ends[0][0] > (now := self._clock()):
            return 0
        looked = 0
        while ends and looked < limit and ends[0][0] <= now:
            until, key, workload = heapq.heappop(ends)
            looked += 1
            if self._until.get(key, {}).get(workload, -1.0) == until:
                self._unpin(key, workload)
        return looked

    def _pinned(self, key: str, workload: str, until: float | None, size: int | None) -> None:
        """`workload` pins `key` until `until`; `size`: its bytes now (None: measure it when asked)."""
        if key not in self._until:
            if size is None:
                self._unmeasured.add(key)
            self._until[key] = {workload: until}
            self.on_hold(key, True)
        self._until[key][workload] = until
        self._keys_of.setdefault(workload, set()).add(key)
        if until is not None:
            heapq.heappush(self._ends, (until, key, workload))
        if size is not None:
            self._used += size - self._sizes.get(key, 0)
            self._sizes[key] = size
            self._unmeasured.discard(key)

    def _unpin(self, key: str, workload: str) -> None:
        pins = self._until[key]
        del pins[workload]
        keys = self._keys_of.get(workload)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys_of[workload]
        if not pins:
            del self._until[key]
            self._used -= self._sizes.pop(key, 0)
            self._unmeasured.discard(key)
            self.on_hold(key, False)

    def pin(self, workload: str, keys: Iterable[str]) -> Pinned:
        """Pin `keys` for `workload` while it exists, within the capacity; see the module docstring."""
        used = self.used()
        out = {"pinned": 0, "pinned_bytes": 0, "refused": 0, "refused_bytes": 0, "missing": 0}
        for key in dict.fromkeys(keys):
            size = self._size_of(key)
            if size is None:
                out["missing"] += 1
                continue
            held = self.holds(key)
            if not held and self.capacity is not None and used + size > self.capacity:
                out["refused"] += 1
                out["refused_bytes"] += size
                continue
            self._pinned(key, workload, None, size)
            used = self._used
            out["pinned"] += 1
            out["pinned_bytes"] += size
        if out["pinned"]:
            self._changed()
        return Pinned(**out, room=None if self.capacity is None else max(0, self.capacity - used))

    def release(self, workload: str, keep: float) -> int:
        """`workload` is gone: its pins hold `keep` more seconds. Returns how many objects it had pinned."""
        until = self._clock() + keep
        released = 0
        for key in self._keys_of.get(workload, ()):
            pins = self._until[key]
            if pins[workload] is None:
                pins[workload] = until
                heapq.heappush(self._ends, (until, key, workload))
                released += 1
        if released:
            self._changed()
        return released

    def snapshot(self) -> dict[str, dict[str, float | None]]:
        """The pins that hold now, key -> workload -> until (None: while it exists), to be saved."""
        return {key: dict(self._until[key]) for key in list(self._until) if self.holds(key)}

    def restore(self, saved: dict[str, dict[str, float | None]]) -> int:
        """Take back pins saved by `snapshot` (a node's start); those past their time are dropped. Returns
        how many objects are pinned again. Their sizes are measured when first asked (`used`)."""
        now = self._clock()
        for key, pins in saved.items():
            for workload, until in pins.items():
                if until is None or until > now:
                    self._pinned(key, workload, until, None)
        return len(self._until)

    def by_workload(self) -> dict[str, int]:
        """Pinned bytes per workload now (an object pinned by two counts for each)."""
        out: dict[str, int] = {}
        for key in list(self._until):
            if not self.holds(key):
                continue
            size = self._size_of(key) or 0
            for workload in self._until.get(key, ()):
                out[workload] = out.get(workload, 0) + size
        return out
