"""How many cache nodes the StatefulSet should run, from the egress they serve. Pure: no I/O.

Load is egress: bytes per second served to clients, read from the
monotonically increasing counter `bytes_served` in the Redis hash
`nezha:stats:node:<id>` of each ready node. The caller samples the counters
on its own clock and feeds `Sample`s into a `LoadHistory`; `decide()` turns
the history, the replica counts and the caller's remembered timestamps into
a `Decision`. Nothing here reads a clock, Redis or the API server, so the
tests drive every timing rule with plain numbers.

The rules, and why:
- Up when the mean egress per ready node exceeds the target, straight to the
  smallest count that brings it under the target: a training job that starts
  reading a dataset wants capacity now, not one node per cooldown. At most
  doubling per step, because the measurement is of the old ring and new
  nodes start cold (they fetch from peers or origin before they serve).
- Down one node at a time, and only after the mean stayed below half the
  target for the whole `scale_down_delay`: removing a node moves its keys to
  the others (they refill from peers or origin), which costs more than an
  idle node; one node at a time keeps each move small.
- Between half the target and the target nothing happens (hysteresis), so a
  load near the target does not flap the ring.
- No step within `scale_cooldown` of the last one: the ring and the load
  need that long to settle after a membership change.

The caller keeps two timestamps between calls: `last_step_at` (when it last
changed the replica count for a Decision) and `low_since` (returned in every
Decision; pass it back next time). Both are on the same clock as `now` and
the samples.

`decide()` never returns a count outside [min_replicas, max_replicas]. A
count already outside (a user's `kubectl scale`) is not an autoscale step:
the caller clamps it and emits its own Event; `decide()` returns the clamped
value with a reason saying so and does not weigh the load that time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Bounds memory whatever the sampling period: at one sample every 5 s this
# still covers 40 minutes, far beyond any sensible delay.
DEFAULT_MAX_SAMPLES = 512


@dataclass(frozen=True)
class Policy:
    """The autoscale bounds and timing of one cache; mapped by the caller from the annotations' Spec.

    Times are seconds. `target_bytes_per_second` is the egress one node
    should serve at most.
    """

    min_replicas: int
    max_replicas: int
    target_bytes_per_second: float
    scale_down_delay: float = 300
    scale_window: float = 30
    scale_cooldown: float = 60

    def __post_init__(self) -> None:
        # min_replicas 0 cannot work: with no node there is no egress to
        # measure, so nothing would ever scale the cache back up.
        if self.min_replicas < 1:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be at least 1")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be at least min_replicas ({self.min_replicas})")
        if not (self.target_bytes_per_second > 0 and math.isfinite(self.target_bytes_per_second)):
            raise ValueError(f"target_bytes_per_second ({self.target_bytes_per_second}) must be a positive number")
        if not self.scale_window > 0:
            raise ValueError(f"scale_window ({self.scale_window}) must be positive")
        for name in ("scale_down_delay", "scale_cooldown"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must not be negative")


@dataclass(frozen=True)
class Sample:
    """The `bytes_served` counters read at time `at`: node id -> counter value.

    Holds only the nodes the caller could read; a node missing from one
    sample is simply not measured over that sample.
    """

    at: float
    served: Mapping[str, int]

    def __post_init__(self) -> None:
        # Read-only copy: a history shares samples between its versions.
        object.__setattr__(self, "served", MappingProxyType(dict(self.served)))


@dataclass(frozen=True)
class Egress:
    """Egress measured over a window: the sum of the nodes' rates, in bytes per second."""

    total: float
    span: float  # seconds between the oldest and the newest sample used
    nodes: int  # nodes that had a rate (present in two samples since their last reset)


@dataclass(frozen=True)
class NoData:
    """Why the history cannot measure egress yet, and when it might."""

    reason: str
    # Seconds until enough samples could span the window (assuming sampling
    # goes on); None when the next sample may already be enough.
    ready_in: float | None


@dataclass(frozen=True)
class LoadHistory:
    """The samples of the last `horizon` seconds, plus the one just older.

    Immutable: `add()` returns a new history, so a caller can keep the old
    one if deciding fails. Memory is bounded twice: by time (`horizon`) and by
    count (`max_samples`, the oldest go first), so a fast sampler cannot grow
    it without limit.
    """

    horizon: float
    max_samples: int = DEFAULT_MAX_SAMPLES
    samples: tuple[Sample, ...] = field(default=())

    @classmethod
    def for_policy(cls, policy: Policy, *, max_samples: int = DEFAULT_MAX_SAMPLES) -> LoadHistory:
        """An empty history long enough for the policy's window and down delay."""
        return cls(horizon=max(policy.scale_window, policy.scale_down_delay), max_samples=max_samples)

    def add(self, sample: Sample) -> LoadHistory:
        """This history with `sample` appended and samples beyond the horizon dropped.

        A sample not newer than the newest one is ignored: counters are rates
        over time, and an out-of-order or repeated reading has no interval.
        """
        if self.samples and sample.at <= self.samples[-1].at:
            return self
        kept = (*self.samples, sample)
        cutoff = sample.at - self.horizon
        # Keep one sample at or before the cutoff, so the horizon is covered
        # from its very start.
        first = 0
        while first + 1 < len(kept) and kept[first + 1].at <= cutoff:
            first += 1
        kept = kept[first:][-self.max_samples:]
        return LoadHistory(horizon=self.horizon, max_samples=self.max_samples, samples=kept)

    def egress(self, *, now: float, window: float) -> Egress | NoData:
        """The egress over the samples taken in the last `window` seconds before `now`.

        Needs at least two samples in the window, at least `window / 2` apart.
        Each node's rate runs from its first sample in the window to the
        newest sample; a node absent from the newest sample is not measured
        (counts as zero). A counter that went down was reset (node restart,
        Redis flush), so the node's rate runs from the sample after the reset
        instead: what it served across the reset is unknown. A node that
        joined mid-window is measured from its first sample, rather than
        counted as idle for a whole window just after a scale-up.
        """
        inside = [s for s in self.samples if s.at >= now - window]
        need = f"need 2 spanning {format_seconds(window / 2)} s"
        if not inside:
            return NoData(f"no load sample in the last {format_seconds(window)} s ({need})", ready_in=window / 2)
        span = inside[-1].at - inside[0].at
        if len(inside) < 2 or span < window / 2:
            count = "1 sample" if len(inside) == 1 else f"{len(inside)} samples over {format_seconds(span)} s"
            wait = inside[0].at + window / 2 - now
            return NoData(
                f"not enough load data: {count} in the last {format_seconds(window)} s ({need})",
                ready_in=wait if wait > 0 else None,
            )
        newest = inside[-1]
        total = 0.0
        measured = 0
        for node, last in newest.served.items():
            start: tuple[float, int] | None = None
            previous: int | None = None
            for s in inside:
                value = s.served.get(node)
                if value is None:
                    continue
                if start is None or (previous is not None and value < previous):
                    start = (s.at, value)
                previous = value
            assert start is not None  # the newest sample has the node
            dt = newest.at - start[0]
            if dt > 0:
                total += (last - start[1]) / dt
                measured += 1
        return Egress(total=total, span=span, nodes=measured)


@dataclass(frozen=True)
class Decision:
    """What the StatefulSet's replica count should be, and what to remember until next time.

    `replicas == current` means no step. `low_since` is the moment the load
    went below half the target (None when it is not below), for the caller
    to pass back. `requeue_after` is in how many seconds a pending step may
    become possible (a cooldown or a down delay ending, data filling the
    window); None when nothing is pending and the next sample is the next
    chance.
    """

    replicas: int
    reason: str
    low_since: float | None
    requeue_after: float | None


def decide(
    *,
    now: float,
    current: int,
    ready: int,
    history: LoadHistory,
    policy: Policy,
    last_step_at: float | None,
    low_since: float | None,
) -> Decision:
    """The replica count the load asks for now; see the module docstring for the rules.

    `current` is the StatefulSet's spec.replicas, `ready` the nodes in the
    ring (the ones whose counters the samples hold). The mean egress per node
    is the total over `ready`, so a ready node without samples counts as idle.
    Never returns a count outside [min_replicas, max_replicas].
    """
    lo, hi = policy.min_replicas, policy.max_replicas
    if not lo <= current <= hi:
        clamped = min(max(current, lo), hi)
        return Decision(
            clamped,
            f"{current} replicas is outside [{lo}, {hi}]: clamping to {clamped} is the caller's, no autoscale step",
            None, None,
        )
    # No data breaks the "continuously low" run: a gap must not count
    # towards a scale-down.
    if ready <= 0:
        return Decision(current, "no ready cache node to measure egress on: no step", None, None)
    measured = history.egress(now=now, window=policy.scale_window)
    if isinstance(measured, NoData):
        return Decision(current, f"{measured.reason}: no step", None, measured.ready_in)

    target = policy.target_bytes_per_second
    mean = measured.total / ready
    load = f"mean egress {format_rate(mean)} per node over {format_seconds(measured.span)} s"
    nodes = f"on {ready} node{'s' if ready != 1 else ''}"
    cooldown_left = 0.0 if last_step_at is None else last_step_at + policy.scale_cooldown - now

    if mean > target:
        return _up(f"{load} > target {format_rate(target)} {nodes}", total=measured.total, current=current,
                   policy=policy, cooldown_left=cooldown_left)
    if mean < 0.5 * target:
        since = now if low_since is None else low_since
        low = f"{load} < half target {format_rate(0.5 * target)} {nodes} for {format_seconds(now - since)} s"
        return _down(low, now=now, since=since, current=current, policy=policy, cooldown_left=cooldown_left)
    return Decision(
        current,
        f"{load} is between half target {format_rate(0.5 * target)} and target {format_rate(target)} {nodes}: no step",
        None, None,
    )


def _up(high: str, *, total: float, current: int, policy: Policy, cooldown_left: float) -> Decision:
    """The step up when the mean egress per node is above the target (`high` says so)."""
    hi = policy.max_replicas
    needed = math.ceil(total / policy.target_bytes_per_second)
    if needed <= current:
        # Pods already asked for but not ready yet will bring the mean
        # under the target; adding more would overshoot.
        return Decision(current, f"{high}: {current} nodes cover it once all are ready, no step", None, None)
    if current >= hi:
        return Decision(current, f"{high}: already at max {hi}", None, None)
    want = min(needed, 2 * current, hi)
    note = ""
    if want < needed:
        note = f" (needs {needed}; {'max' if want == hi else 'at most doubling'})"
    if cooldown_left > 0:
        return Decision(
            current,
            f"{high}: would scale {current} -> {want}, but in cooldown for {format_seconds(cooldown_left)} s more",
            None, cooldown_left,
        )
    return Decision(want, f"{high}: {current} -> {want}{note}", None, policy.scale_cooldown or None)


def _down(low: str, *, now: float, since: float, current: int, policy: Policy, cooldown_left: float) -> Decision:
    """The step down when the mean egress per node has been below half the
    target since `since` (`low` says so): one node, once the delay and the
    cooldown are over."""
    lo = policy.min_replicas
    if current <= lo:
        return Decision(current, f"{low}: already at min {lo}", since, None)
    delay_left = since + policy.scale_down_delay - now
    if delay_left > 0 or cooldown_left > 0:
        waits = []
        if delay_left > 0:
            waits.append(f"delay {format_seconds(policy.scale_down_delay)} s")
        if cooldown_left > 0:
            waits.append(f"cooldown for {format_seconds(cooldown_left)} s more")
        return Decision(
            current,
            f"{low}: would scale {current} -> {current - 1} after {' and '.join(waits)}",
            since, max(delay_left, cooldown_left),
        )
    # The next step down waits another full delay, measured on the
    # smaller ring.
    return Decision(current - 1, f"{low}: {current} -> {current - 1}", None, policy.scale_cooldown or None)


_RATE_UNITS = ("B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s")


def format_rate(bytes_per_second: float) -> str:
    """A rate in decimal units with three significant digits: 180 MB/s, 1.5 GB/s, 950 kB/s.

    Decimal (1 MB = 10^6 bytes) like network links and the annotations' targets.
    """
    value = float(bytes_per_second)
    unit = _RATE_UNITS[0]
    for unit in _RATE_UNITS:
        if abs(value) < 999.5 or unit == _RATE_UNITS[-1]:
            break
        value /= 1000
    return f"{value:.3g} {unit}"


def format_seconds(seconds: float) -> str:
    """Seconds to one decimal, without a trailing .0 and never in exponent form: 30, 28.5, 1200."""
    text = f"{seconds:.1f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text
