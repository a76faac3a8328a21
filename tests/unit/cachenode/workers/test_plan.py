"""How many workers a node runs by default, and how soon a dead one starts again."""

import pytest

from cachenode.workers.plan import (MAX_AUTO_WORKERS, WORKER_MEMORY, auto_workers, memory_limit, restart_delay,
                                    usable_cpus)

MiB = 1024 ** 2


def test_a_cgroup_quota_below_the_affinity_bounds_the_workers():
    assert usable_cpus(64, "200000 100000\n") == 2


def test_a_fractional_quota_rounds_up_to_a_whole_worker():
    assert usable_cpus(8, "150000 100000") == 2
    assert usable_cpus(8, "50000 100000") == 1


def test_no_quota_means_the_affinity_mask():
    assert usable_cpus(6, "max 100000") == 6
    assert usable_cpus(6, None) == 6


def test_a_quota_above_the_affinity_does_not_add_cpus():
    assert usable_cpus(2, "800000 100000") == 2


def test_unreadable_cpu_max_text_is_ignored_and_there_is_always_one_worker():
    assert usable_cpus(4, "garbage") == 4
    assert usable_cpus(4, "x 100000") == 4
    assert usable_cpus(0, None) == 1


def test_a_first_crash_restarts_at_once_and_repeated_quick_exits_back_off_to_ten_seconds():
    assert restart_delay(1) == 0.0
    assert restart_delay(2) == 0.5
    assert restart_delay(3) == 1.0
    assert restart_delay(20) == 10.0


def test_a_sidecar_on_a_192_cpu_gpu_node_under_512mi_starts_what_the_memory_holds():
    """A sidecar with no CPU limit sees the node's 192 CPUs; its 512 MiB
    limit holds five workers of WORKER_MEMORY, not 192 of them."""
    workers = auto_workers(affinity=192, cpu_max="max 100000\n", memory_max=f"{512 * MiB}\n")
    assert workers == 512 * MiB // WORKER_MEMORY == 5
    assert workers * 70 * MiB < 512 * MiB  # each worker's measured idle RSS fits, with room to serve


def test_a_big_server_without_any_cgroup_limit_stops_at_the_stated_ceiling():
    assert auto_workers(affinity=192, cpu_max="max 100000", memory_max="max\n") == MAX_AUTO_WORKERS == 16
    assert auto_workers(affinity=192, cpu_max=None, memory_max=None) == MAX_AUTO_WORKERS


def test_a_cpu_quota_below_the_memory_bound_decides():
    assert auto_workers(affinity=192, cpu_max="300000 100000", memory_max=f"{8 * 1024 * MiB}") == 3


def test_a_memory_limit_below_one_worker_still_runs_one():
    assert auto_workers(affinity=192, cpu_max="max 100000", memory_max=f"{64 * MiB}") == 1


@pytest.mark.parametrize("text, limit", [
    ("max\n", None), ("536870912\n", 512 * MiB), ("", None), (None, None), ("garbage", None),
    ("9223372036854771712\n", None),  # cgroup v1's "no limit"
])
def test_memory_max_text_reads_as_bytes_or_no_limit(text, limit):
    assert memory_limit(text) == limit


def test_worker_count_reads_the_cgroup_files_and_takes_a_number_as_given(tmp_path, monkeypatch):
    from cachenode import cli

    cpu, memory = tmp_path / "cpu.max", tmp_path / "memory.max"
    cpu.write_text("max 100000\n")
    memory.write_text(f"{512 * MiB}\n")
    monkeypatch.setattr(cli, "CPU_MAX_FILES", (cpu,))
    monkeypatch.setattr(cli, "MEMORY_MAX_FILES", (tmp_path / "absent", memory))
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: set(range(192)))
    assert cli.worker_count("auto") == 5
    assert cli.worker_count("24") == 24
