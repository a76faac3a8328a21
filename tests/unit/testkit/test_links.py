"""Link rates from sampled byte counters (testkit/links.py): a counters source that takes time to answer never
makes a link look faster than it sent, a link kept to its cap is never counted above it, and one sent twice as
fast is, for as long as it was."""

from __future__ import annotations

import pytest

from testkit import links
from testkit.links import Sample, take
from testkit.stampede import Scene

RATE = 10_000_000  # bytes/s the simulated link sends


class SlowLink:
    """A link sending `rates[i]` bytes/s through second i, and counters that answer only after `delays[n]`
    seconds (the n-th read), reading the count at the moment they answer: a loaded box's `ip -s link`."""

    def __init__(self, delays: list[float], rates=lambda t: RATE) -> None:
        self.now, self.delays, self.reads, self.rate_at = 0.0, delays, 0, rates

    def clock(self) -> float:
        return self.now

    def sent_by(self, t: float) -> int:
        step, total, at = 0.001, 0.0, 0.0
        while at < t:
            total += self.rate_at(at) * min(step, t - at)
            at += step
        return int(total)

    def read(self) -> dict[str, tuple[int, int]]:
        self.now += self.delays[self.reads % len(self.delays)]
        self.reads += 1
        return {"node0": (self.sent_by(self.now), 0)}

    def samples(self, count: int, every: float = 0.1) -> list[Sample]:
        got = []
        for _ in range(count):
            got.append(take(self.read, self.clock))
            self.now += every
        return got


def test_a_counters_source_slow_to_answer_never_yields_a_rate_above_what_was_sent():
    # Fast reads, then one that takes 0.4 s: the bytes it counts run to its end.
    samples = SlowLink([0.01, 0.01, 0.01, 0.01, 0.4]).samples(40)
    fastest = links.peak(samples)["node0"]
    assert fastest <= RATE
    assert fastest >= 0.8 * RATE  # and still reads the link, not nothing


def test_stamping_only_the_moment_before_the_read_over_reads_the_same_samples():
    # The measurement the fix replaces, on the same samples: the test above could fail.
    samples = SlowLink([0.01, 0.01, 0.01, 0.01, 0.4]).samples(40)
    stamped_before = [Sample(s.before, s.before, s.counters) for s in samples]
    assert links.peak(stamped_before)["node0"] > 1.2 * RATE


def test_a_link_kept_to_its_cap_spends_no_time_above_it():
    samples = SlowLink([0.01, 0.05, 0.3]).samples(60)
    assert links.above(samples, {"node0": RATE}) == {"node0": 0.0}


def test_a_link_sent_twice_its_cap_for_two_seconds_is_counted_above_it_about_two_seconds():
    link = SlowLink([0.02], rates=lambda t: 2 * RATE if 1.0 <= t < 3.0 else RATE)
    over = links.above(link.samples(60), {"node0": RATE})["node0"]
    assert 1.4 <= over <= 2.6


def test_carried_is_what_the_counters_moved_between_the_first_sample_and_the_last():
    samples = [Sample(0.0, 0.1, {"a": (10, 20)}), Sample(1.0, 1.1, {"a": (110, 70)}),
               Sample(2.0, 2.1, {"a": (310, 90)})]
    assert links.carried(samples) == {"a": (300, 70)}
    assert links.carried(samples[:1]) == {}
    assert links.within(samples, 0.9, 1.2) == samples[1:2]


def test_an_even_spread_gives_every_node_its_share_and_a_random_one_repeats_with_its_seed():
    even = Scene(config="shipped", nodes=3, clients=8, size=1, node_rate=1, origin_rate=1)
    assert even.groups == [3, 3, 2]
    spread = [Scene(config="shipped", nodes=4, clients=16, size=1, node_rate=1, origin_rate=1, spread="random",
                    seed=seed).groups for seed in range(20)]
    assert all(sum(g) == 16 for g in spread)
    assert spread[3] == Scene(config="shipped", nodes=4, clients=16, size=1, node_rate=1, origin_rate=1,
                              spread="random", seed=3).groups
    assert any(g != [4, 4, 4, 4] for g in spread)  # random: not round-robin in disguise
    with pytest.raises(ValueError, match="spread 'zipf'"):
        Scene(config="shipped", nodes=2, clients=2, size=1, node_rate=1, origin_rate=1, spread="zipf")
