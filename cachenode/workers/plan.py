"""How many workers a node runs, and when a dead one is started again. Pure.

The default is the CPUs the process may really use: the smaller of its
affinity mask and its cgroup's CPU quota (`cpu.max`, rounded up), since a
pod limited to 2 CPUs on a 64-core machine sees all 64 in its affinity but
is throttled to 2, and 64 workers there would only contend.
"""

from __future__ import annotations

import math


def usable_cpus(affinity: int, cpu_max: str | None) -> int:
    """CPUs from the affinity mask's size and cgroup v2's `cpu.max` text
    ("max 100000" or "<quota> <period>"); at least 1."""
    cpus = max(1, affinity)
    if cpu_max:
        parts = cpu_max.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = int(parts[0]), int(parts[1])
            except ValueError:
                return cpus
            if quota > 0 and period > 0:
                cpus = min(cpus, max(1, math.ceil(quota / period)))
    return cpus


def restart_delay(quick_exits: int) -> float:
    """Seconds to wait before starting a worker again after `quick_exits`
    exits in a row that each came soon after its start: at once the first
    time (a crash is rare, the node should be whole again quickly), then
    doubling from half a second up to ten, so a worker that cannot start
    does not spin a core."""
    if quick_exits <= 1:
        return 0.0
    return min(10.0, 0.5 * 2 ** (quick_exits - 2))
