"""How many workers a node runs, and when a dead one is started again. Pure.

The default (`--workers auto`) is the smallest of three bounds:

- the CPUs the process may really use: the smaller of its affinity mask and
  its cgroup's CPU quota (`cpu.max`, rounded up), since a pod limited to 2
  CPUs on a 64-core machine sees all 64 in its affinity but is throttled to
  2, and 64 workers there would only contend;
- the workers its cgroup's memory limit (`memory.max`) holds at
  WORKER_MEMORY each: a sidecar with no CPU limit on a 192-CPU GPU node
  sees 192 CPUs, and 192 workers of 70 MiB under a 512 MiB limit is an
  OOM-killed pod;
- MAX_AUTO_WORKERS, for a large server with neither limit.

A number given explicitly is taken as it is: the operator chose it.
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


# What one worker costs in memory, for the `memory.max` bound. Measured
# (VmRSS and VmHWM in /proc/<pid>/status of each worker of `nezha cache
# --workers 2`, Python 3.11): 70 MiB idle, and a peak of 70.2 MiB while 16
# clients read a 200 MB object, cold (one fill in 8 ranges) and warm; bodies
# go through the disk, not memory. The budget leaves room for what a node
# holds beyond that (many connections' buffers, a large index): 96 MiB.
WORKER_MEMORY = 96 * 1024 ** 2
# The most workers `auto` starts. One primary fills, writes, counts and is
# handed every request a follower does not answer from disk; past about 16
# followers it, not the CPUs, is what limits the node, and each further
# worker is only memory. A larger --workers is still taken as given.
MAX_AUTO_WORKERS = 16


def memory_limit(memory_max: str | None) -> int | None:
    """Bytes in cgroup v2's `memory.max` text ("max", or a number of bytes;
    cgroup v1's `memory.limit_in_bytes` too, whose "no limit" is a number
    near 2**63); None when there is no limit or the text is not one."""
    if not memory_max:
        return None
    text = memory_max.strip()
    if not text.isdigit():
        return None
    limit = int(text)
    return None if limit <= 0 or limit >= 2 ** 62 else limit


def auto_workers(*, affinity: int, cpu_max: str | None, memory_max: str | None) -> int:
    """`--workers auto`: the usable CPUs, bounded by the memory limit at
    WORKER_MEMORY a worker and by MAX_AUTO_WORKERS; at least 1."""
    workers = min(usable_cpus(affinity, cpu_max), MAX_AUTO_WORKERS)
    limit = memory_limit(memory_max)
    if limit is not None:
        workers = min(workers, limit // WORKER_MEMORY)
    return max(1, workers)


def restart_delay(quick_exits: int) -> float:
    """Seconds to wait before starting a worker again after `quick_exits`
    exits in a row that each came soon after its start: at once the first
    time (a crash is rare, the node should be whole again quickly), then
    doubling from half a second up to ten, so a worker that cannot start
    does not spin a core."""
    if quick_exits <= 1:
        return 0.0
    return min(10.0, 0.5 * 2 ** (quick_exits - 2))
