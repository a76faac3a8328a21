"""The autoscaler's decision, driven by load histories on an injected clock (plain numbers, no sleeps)."""

import pytest

from controller.autoscale import (
    Decision, Egress, LoadHistory, NoData, Policy, Sample, decide, format_rate, format_seconds,
)

MB = 1_000_000
POLICY = Policy(
    min_replicas=2, max_replicas=10, target_bytes_per_second=100 * MB,
    scale_down_delay=300, scale_window=30, scale_cooldown=60,
)


def history_of(points, policy=POLICY):
    """A history holding `points`: (t, {node: counter}) in time order."""
    h = LoadHistory.for_policy(policy)
    for t, served in points:
        h = h.add(Sample(t, served))
    return h


def steady(per_node, *, nodes, end=30, every=10):
    """Samples from 0 to `end` of `nodes` nodes each serving `per_node` bytes/s."""
    return [(t, {f"n{i}": int(per_node * t) for i in range(nodes)}) for t in range(0, end + 1, every)]


def decide_at(points, *, now=30, current, ready=None, last_step_at=None, low_since=None, policy=POLICY):
    return decide(
        now=now, current=current, ready=current if ready is None else ready, history=history_of(points, policy),
        policy=policy, last_step_at=last_step_at, low_since=low_since,
    )


def simulate(total_rate, *, start_replicas, until, policy=POLICY, every=10):
    """Runs the controller loop on a fake clock; returns the steps as (t, from, to).

    `total_rate(t)` is the egress of the whole cache over the interval ending
    at t, spread evenly over the current nodes, which are all ready at once.
    Every tick samples the counters, decides, and applies the decision like
    the caller would.
    """
    current, counters = start_replicas, {f"n{i}": 0 for i in range(start_replicas)}
    h, last_step_at, low_since, steps = LoadHistory.for_policy(policy), None, None, []
    for t in range(0, until + 1, every):
        if t:
            for node in counters:
                counters[node] += int(total_rate(t) * every / len(counters))
        h = h.add(Sample(t, counters))
        d = decide(now=t, current=current, ready=current, history=h, policy=policy,
                   last_step_at=last_step_at, low_since=low_since)
        assert policy.min_replicas <= d.replicas <= policy.max_replicas
        low_since = d.low_since
        if d.replicas != current:
            steps.append((t, current, d.replicas))
            last_step_at, current = t, d.replicas
            counters = {f"n{i}": counters.get(f"n{i}", 0) for i in range(current)}
    return steps


@pytest.mark.parametrize("current,per_node,want", [
    (3, 180 * MB, 6),   # 540 MB/s needs 6
    (3, 110 * MB, 4),   # 330 MB/s needs 4: only as many as it takes
    (4, 101 * MB, 5),   # just over the target: at least one more
    (2, 500 * MB, 4),   # needs 10: at most doubling
    (8, 150 * MB, 10),  # needs 12: capped at max
    (9, 300 * MB, 10),
])
def test_load_above_target_scales_up_by_enough_nodes_at_most_doubling_and_capped_at_max(current, per_node, want):
    d = decide_at(steady(per_node, nodes=current), current=current)
    assert d.replicas == want
    assert d.low_since is None
    assert d.requeue_after == POLICY.scale_cooldown  # the next step is possible once the cooldown ends


def test_reason_names_the_mean_egress_the_window_the_target_and_the_nodes():
    d = decide_at(steady(180 * MB, nodes=3), current=3)
    assert d.reason == "mean egress 180 MB/s per node over 30 s > target 100 MB/s on 3 nodes: 3 -> 6"


@pytest.mark.parametrize("current,per_node,note", [
    (2, 500 * MB, "(needs 10; at most doubling)"),
    (8, 150 * MB, "(needs 12; max)"),
])
def test_reason_says_why_fewer_nodes_were_added_than_needed(current, per_node, note):
    assert decide_at(steady(per_node, nodes=current), current=current).reason.endswith(note)


def test_high_load_at_max_takes_no_step():
    d = decide_at(steady(300 * MB, nodes=10), current=10)
    assert (d.replicas, d.requeue_after) == (10, None)
    assert "already at max 10" in d.reason


def test_high_load_with_pods_still_starting_waits_for_them():
    """3 of 6 nodes ready, serving 180 MB/s each: the 3 starting ones will cover it."""
    d = decide_at(steady(180 * MB, nodes=3), current=6, ready=3)
    assert d.replicas == 6
    assert "6 nodes cover it once all are ready" in d.reason


@pytest.mark.parametrize("per_node", [50 * MB, 75 * MB, 100 * MB])
def test_load_between_half_target_and_target_takes_no_step_and_resets_low_since(per_node):
    d = decide_at(steady(per_node, nodes=4), current=4, low_since=0.0)
    assert d == Decision(4, d.reason, None, None)
    assert "between half target 50 MB/s and target 100 MB/s on 4 nodes: no step" in d.reason


@pytest.mark.parametrize("per_node,last_step_at,now,want,requeue_after", [
    (180 * MB, 0.0, 30, 3, 30.0),     # up wanted, 30 s of cooldown left
    (180 * MB, 0.0, 59.5, 3, 0.5),
    (180 * MB, 0.0, 60, 6, 60.0),     # cooldown over: the step, then a full cooldown
    (180 * MB, -100.0, 30, 6, 60.0),
])
def test_no_step_up_inside_the_cooldown_after_the_last_step(per_node, last_step_at, now, want, requeue_after):
    points = [(t + now - 30, served) for t, served in steady(per_node, nodes=3)]
    d = decide_at(points, now=now, current=3, last_step_at=last_step_at)
    assert (d.replicas, d.requeue_after) == (want, requeue_after)
    if want == 3:
        assert "would scale 3 -> 6, but in cooldown" in d.reason


@pytest.mark.parametrize("low_since,last_step_at,want,low_after,requeue_after", [
    (None, None, 4, 1000.0, 300.0),    # just went low: the whole delay ahead
    (800.0, None, 4, 800.0, 100.0),
    (700.5, None, 4, 700.5, 0.5),
    (700.0, None, 3, None, 60.0),      # low for the full delay: one node down, the delay restarts
    (0.0, None, 3, None, 60.0),
    (0.0, 980.0, 4, 0.0, 40.0),        # delay over but still cooling down
    (900.0, 980.0, 4, 900.0, 200.0),   # both pending: the later end
])
def test_low_load_steps_down_only_after_the_full_delay_and_the_cooldown(
        low_since, last_step_at, want, low_after, requeue_after):
    points = [(t + 970, served) for t, served in steady(10 * MB, nodes=4)]
    d = decide_at(points, now=1000, current=4, low_since=low_since, last_step_at=last_step_at)
    assert (d.replicas, d.low_since, d.requeue_after) == (want, low_after, requeue_after)


def test_reason_for_a_step_down_names_the_half_target_and_how_long_it_was_low():
    points = [(t + 970, served) for t, served in steady(10 * MB, nodes=4)]
    d = decide_at(points, now=1000, current=4, low_since=700.0)
    assert d.reason == "mean egress 10 MB/s per node over 30 s < half target 50 MB/s on 4 nodes for 300 s: 4 -> 3"


def test_low_load_at_min_takes_no_step_and_keeps_tracking_low_since():
    d = decide_at(steady(1 * MB, nodes=2), current=2, low_since=-5000.0)
    assert (d.replicas, d.low_since, d.requeue_after) == (2, -5000.0, None)
    assert "already at min 2" in d.reason


def low(t):
    return 40 * MB


def blip(t):
    return 300 * MB if 150 <= t <= 190 else 40 * MB


def surge(t):
    return 1200 * MB if t >= 100 else 40 * MB


@pytest.mark.parametrize("load,start,until,steps", [
    # Low from the start; data is enough at t=20 (two samples over 20 s).
    # Each step waits the full delay from the first low reading after the
    # previous step, one node at a time, and never goes below min 2.
    (low, 5, 2000, [(320, 5, 4), (630, 4, 3), (940, 3, 2)]),
    # The blip lifts the 30 s mean over half the target from t=170 to 190;
    # the delay restarts at 200, not 20.
    (blip, 5, 600, [(500, 5, 4)]),
    # 1200 MB/s from t=100 (the first window holds one high interval: 427 MB/s,
    # needs 5): 2 -> 4 (at most doubling), 4 -> 8 when the cooldown ends,
    # then 8 -> 10 (needs 12, max 10), and no further.
    (surge, 2, 600, [(100, 2, 4), (160, 4, 8), (220, 8, 10)]),
])
def test_a_controller_loop_on_a_fake_clock_steps_as_the_rules_say(load, start, until, steps):
    assert simulate(load, start_replicas=start, until=until) == steps


@pytest.mark.parametrize("current,want", [(1, 2), (0, 2), (11, 10), (50, 10)])
def test_a_count_outside_the_bounds_is_returned_clamped_and_left_to_the_caller(current, want):
    """A user's `kubectl scale` is the caller's to clamp (with its Event); decide only never leaves the bounds."""
    d = decide_at(steady(500 * MB, nodes=3), current=current, ready=3, low_since=0.0)
    assert (d.replicas, d.low_since, d.requeue_after) == (want, None, None)
    assert "the caller's, no autoscale step" in d.reason


@pytest.mark.parametrize("points,now,total,nodes", [
    (steady(10 * MB, nodes=1), 30, 10 * MB, 1),
    (steady(10 * MB, nodes=3), 30, 30 * MB, 3),
    # Node restarted between 10 and 20: only 20 -> 30 counts.
    ([(0, {"a": 0}), (10, {"a": 1000 * MB}), (20, {"a": 50 * MB}), (30, {"a": 150 * MB})], 30, 10 * MB, 1),
    # Reset at the newest sample: no interval yet, the node is not measured.
    ([(0, {"a": 0, "b": 0}), (10, {"a": 900, "b": 100 * MB}), (20, {"a": 10, "b": 200 * MB})], 20, 10 * MB, 1),
    # Joined mid-window (a new node after a scale-up): measured from its first sample.
    ([(0, {"a": 0}), (10, {"a": 100 * MB}), (20, {"a": 200 * MB, "b": 5}), (30, {"a": 300 * MB, "b": 50 * MB + 5})],
     30, 15 * MB, 2),
    # Missing from the newest sample: not measured (the caller reads only ready nodes).
    ([(0, {"a": 0, "b": 0}), (30, {"a": 300 * MB})], 30, 10 * MB, 1),
    # Missing from a middle sample (a failed read): measured across it.
    ([(0, {"a": 0}), (10, {}), (30, {"a": 300 * MB})], 30, 10 * MB, 1),
    # Samples older than the window are not used.
    ([(-100, {"a": 0}), (0, {"a": 5000 * MB}), (30, {"a": 5300 * MB})], 30, 10 * MB, 1),
    # The window ends at `now`: only samples from 10 on count here.
    ([(0, {"a": 0}), (10, {"a": 10 * MB}), (40, {"a": 310 * MB})], 40, 10 * MB, 1),
])
def test_egress_sums_each_nodes_rate_since_its_first_sample_or_last_reset(points, now, total, nodes):
    e = history_of(points).egress(now=now, window=30)
    assert isinstance(e, Egress)
    assert (e.total, e.nodes) == (pytest.approx(total), nodes)


def test_counter_reset_does_not_read_as_negative_load():
    """A node restart drops its counter to zero; the cache must not look idle and scale down."""
    points = [(0, {"a": 0, "b": 0}), (10, {"a": 800 * MB, "b": 800 * MB}), (20, {"a": 10, "b": 1600 * MB}),
              (30, {"a": 800 * MB + 10, "b": 2400 * MB})]
    d = decide_at(points, current=2, low_since=0.0)
    assert d.replicas == 2 and d.low_since is None  # a: 80 MB/s after its reset, b: 80 MB/s


@pytest.mark.parametrize("points,now,ready,fragment,requeue_after", [
    ([], 30, 3, "no load sample in the last 30 s (need 2 spanning 15 s)", 15.0),
    ([(0, {"a": 0})], 0, 3, "not enough load data: 1 sample in the last 30 s", 15.0),
    ([(0, {"a": 0}), (10, {"a": 1})], 10, 3, "2 samples over 10 s in the last 30 s (need 2 spanning 15 s)", 5.0),
    ([(0, {"a": 0}), (10, {"a": 1})], 14, 3, "2 samples over 10 s", 1.0),
    ([(0, {"a": 0}), (10, {"a": 1})], 25, 3, "2 samples over 10 s", None),  # the next sample will do
    ([(0, {"a": 0}), (10, {"a": 1})], 100, 3, "no load sample in the last 30 s", 15.0),  # sampling stopped
    (steady(MB, nodes=3), 30, 0, "no ready cache node", None),
])
def test_not_enough_data_takes_no_step_says_why_and_breaks_the_low_run(points, now, ready, fragment, requeue_after):
    d = decide_at(points, now=now, current=3, ready=ready, low_since=0.0)
    assert (d.replicas, d.low_since, d.requeue_after) == (3, None, requeue_after)
    assert fragment in d.reason and d.reason.endswith("no step")


def test_ready_nodes_without_samples_count_as_idle():
    """Two nodes serve 150 MB/s each, but four are ready: 75 MB/s per node, inside the hysteresis band."""
    d = decide_at(steady(150 * MB, nodes=2), current=4, ready=4)
    assert d.replicas == 4 and "mean egress 75 MB/s per node" in d.reason


@pytest.mark.parametrize("max_samples,kept,first", [
    (512, 301, 699),  # the horizon (300 s) plus the one sample at its start
    (50, 50, 950),    # the count bound wins: the oldest go first
])
def test_history_keeps_only_the_horizon_and_a_bounded_number_of_samples(max_samples, kept, first):
    h = LoadHistory.for_policy(POLICY, max_samples=max_samples)
    for t in range(1000):
        h = h.add(Sample(t, {"a": t}))
    assert (len(h.samples), h.samples[0].at, h.samples[-1].at) == (kept, first, 999)


def test_history_horizon_covers_the_longer_of_window_and_down_delay():
    assert LoadHistory.for_policy(POLICY).horizon == 300
    assert LoadHistory.for_policy(Policy(min_replicas=1, max_replicas=2, target_bytes_per_second=1,
                                         scale_down_delay=10, scale_window=45)).horizon == 45


def test_a_sample_not_newer_than_the_last_is_ignored():
    h = history_of([(10, {"a": 5})])
    assert h.add(Sample(10, {"a": 9})) is h
    assert h.add(Sample(3, {"a": 9})) is h


def test_a_sample_is_a_frozen_copy_of_the_counters():
    counters = {"a": 1}
    s = Sample(0, counters)
    counters["a"] = 2
    assert s.served["a"] == 1
    with pytest.raises(TypeError):
        s.served["a"] = 3


@pytest.mark.parametrize("kwargs,message", [
    ({"min_replicas": 0}, "min_replicas (0) must be at least 1"),
    ({"max_replicas": 1}, "max_replicas (1) must be at least min_replicas (2)"),
    ({"target_bytes_per_second": 0}, "target_bytes_per_second (0) must be a positive number"),
    ({"target_bytes_per_second": float("inf")}, "target_bytes_per_second (inf) must be a positive number"),
    ({"scale_window": 0}, "scale_window (0) must be positive"),
    ({"scale_down_delay": -1}, "scale_down_delay (-1) must not be negative"),
    ({"scale_cooldown": float("nan")}, "scale_cooldown (nan) must not be negative"),
])
def test_a_policy_that_cannot_work_is_refused_naming_the_field(kwargs, message):
    fields = {"min_replicas": 2, "max_replicas": 10, "target_bytes_per_second": 100 * MB} | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Policy(**fields)


def test_a_policy_without_cooldown_asks_for_no_immediate_requeue_after_a_step():
    policy = Policy(min_replicas=1, max_replicas=10, target_bytes_per_second=100 * MB, scale_cooldown=0)
    d = decide_at(steady(180 * MB, nodes=3), current=3, policy=policy)
    assert (d.replicas, d.requeue_after) == (6, None)


@pytest.mark.parametrize("rate,text", [
    (0, "0 B/s"),
    (950, "950 B/s"),
    (999.4, "999 B/s"),
    (999.6, "1 kB/s"),
    (950_000, "950 kB/s"),
    (180 * MB, "180 MB/s"),
    (50 * MB, "50 MB/s"),
    (12_345_678, "12.3 MB/s"),
    (1_500_000_000, "1.5 GB/s"),
    (2.5e15, "2.5 PB/s"),
    (7e18, "7e+03 PB/s"),
])
def test_rates_are_written_in_decimal_units_with_three_significant_digits(rate, text):
    assert format_rate(rate) == text


@pytest.mark.parametrize("seconds,text", [(30, "30"), (28.46, "28.5"), (1200.0, "1200"), (0.04, "0"), (0.5, "0.5")])
def test_seconds_are_written_without_trailing_zeros_or_exponents(seconds, text):
    assert format_seconds(seconds) == text


def test_no_data_is_a_value_not_an_exception():
    assert isinstance(LoadHistory(horizon=30).egress(now=0, window=30), NoData)
