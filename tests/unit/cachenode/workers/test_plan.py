"""How many workers a node runs by default, and how soon a dead one starts again."""

from cachenode.workers.plan import restart_delay, usable_cpus


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
