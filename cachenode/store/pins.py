"""Objects kept from eviction for the workloads that prefetched them (docs/controller.md, "Kept while used").

The controller pins what a workload's prefetch stored, on the node that
stores it (`POST /_nezha/pins`: cachenode/cluster/pinning.py), while the
workload exists, and releases it when the workload is deleted: the pins
then hold for the workload's `nezha.io/prefetch-keep` more seconds. The
store's index asks `holds(key)` before it evicts an object (the one check
eviction makes of pins), and passes over a held one.

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

No I/O: the store's sizes come through `size_of`, time through `clock`.
"""

from __future__ import annotations

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
                 clock: Callable[[], float] = time.time, changed: Callable[[], None] = lambda: None) -> None:
        self.capacity = capacity
        self._size_of = size_of
        self._clock = clock
        self._changed = changed  # told after every pin and release: the store saves the pins
        self._until: dict[str, dict[str, float | None]] = {}  # key -> workload -> until (None: while it exists)

    def holds(self, key: str) -> bool:
        """Whether `key` is kept from eviction now; a pin past its time is dropped on the way."""
        pins = self._until.get(key)
        if not pins:
            return False
        now = self._clock()
        for workload, until in list(pins.items()):
            if until is not None and until <= now:
                del pins[workload]
        if not pins:
            del self._until[key]
            return False
        return True

    def used(self) -> int:
        """Bytes held by pins now (an object pinned twice counts once)."""
        return sum(self._size_of(key) or 0 for key in list(self._until) if self.holds(key))

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
            self._until.setdefault(key, {})[workload] = None
            if not held:
                used += size
            out["pinned"] += 1
            out["pinned_bytes"] += size
        if out["pinned"]:
            self._changed()
        return Pinned(**out, room=None if self.capacity is None else max(0, self.capacity - used))

    def release(self, workload: str, keep: float) -> int:
        """`workload` is gone: its pins hold `keep` more seconds. Returns how many objects it had pinned."""
        until = self._clock() + keep
        released = 0
        for pins in self._until.values():
            if workload in pins and pins[workload] is None:
                pins[workload] = until
                released += 1
        if released:
            self._changed()
        return released

    def snapshot(self) -> dict[str, dict[str, float | None]]:
        """The pins that hold now, key -> workload -> until (None: while it exists), to be saved."""
        return {key: dict(self._until[key]) for key in list(self._until) if self.holds(key)}

    def restore(self, saved: dict[str, dict[str, float | None]]) -> int:
        """Take back pins saved by `snapshot` (a node's start); those past their time are dropped. Returns
        how many objects are pinned again."""
        now = self._clock()
        for key, pins in saved.items():
            held = {w: until for w, until in pins.items() if until is None or until > now}
            if held:
                self._until.setdefault(key, {}).update(held)
        return len(self._until)

    def by_workload(self) -> dict[str, int]:
        """Pinned bytes per workload now (an object pinned by two counts for each)."""
        out: dict[str, int] = {}
        for key in list(self._until):
            if not self.holds(key):
                continue
            size = self._size_of(key) or 0
            for workload in self._until[key]:
                out[workload] = out.get(workload, 0) + size
        return out
