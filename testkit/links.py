"""What each link of a simulated network carried while a scene ran, from its byte counters sampled as it ran.

A sample is the counters as one call read them (`ip -s -j link show`, which
on a loaded box takes tens to hundreds of milliseconds), so a sample keeps
the moments just before and just after that call: the counters were read
somewhere between. A rate over two samples divides the bytes between them
by the longest the interval can have been, the later sample's `after` less
the earlier's `before`, so a slow read can make a link look slower than it
ran but never faster. Stamping only the moment before the call did: when
the later read was the slower one, the bytes counted up to its end were
divided by an interval that stopped at its start, and 10 MB/s links read
as 15-18 MB/s.

    Sampler(read)  a thread taking a sample every 0.1 s while the scene runs
    carried        bytes each host sent and received in a window
    peak           each host's fastest second, sending or receiving
    above          seconds each host ran above its cap (× a stated factor)

The math is pure (samples in, figures out), tested with a counters source
that takes time to answer (tests/unit/testkit/test_links.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Counters = dict[str, tuple[int, int]]  # host: (bytes sent, bytes received)

# A window shorter than this lets the token bucket's burst (64 KiB) pass as
# over the cap: 64 KiB in 0.1 s is 0.66 MB/s; in 0.5 s, 0.13 MB/s (1.3 % of 10 MB/s).
ABOVE_WINDOW = 0.5
ABOVE_FACTOR = 1.05


@dataclass(frozen=True)
class Sample:
    before: float  # the clock just before the counters were asked for
    after: float  # and just after they answered
    counters: Counters

    @property
    def middle(self) -> float:
        return (self.before + self.after) / 2


def take(read: Callable[[], Counters], clock: Callable[[], float] = time.monotonic) -> Sample:
    """One sample: the counters, with the moments around the call that read them."""
    before = clock()
    counters = read()
    return Sample(before, clock(), counters)


def rate(a: Sample, b: Sample, host: str) -> float:
    """`host`'s rate from `a` to `b`, bytes/s, the faster of sending and receiving, over the longest the
    interval can have been: never above what the link moved."""
    (sent0, got0), (sent1, got1) = a.counters[host], b.counters[host]
    return max(sent1 - sent0, got1 - got0) / (b.after - a.before)


def within(samples: list[Sample], started: float, ended: float, *, margin: float = 0.2) -> list[Sample]:
    """The samples taken between `started` and `ended` (the clock's), with `margin` either side."""
    return [s for s in samples if s.before >= started - margin and s.after <= ended + margin]


def carried(samples: list[Sample]) -> Counters:
    """Bytes each host sent and received from the first sample to the last."""
    if len(samples) < 2:
        return {}
    first, last = samples[0].counters, samples[-1].counters
    return {h: (last[h][0] - first[h][0], last[h][1] - first[h][1]) for h in first}


def peak(samples: list[Sample], *, span: float = 1.0) -> dict[str, float]:
    """Each host's fastest `span` seconds, bytes/s: from every sample, to the first at least `span` later."""
    fastest: dict[str, float] = {}
    for i, a in enumerate(samples):
        b = next((b for b in samples[i + 1:] if b.after - a.before >= span), None)
        if b is None:
            break
        for h in a.counters:
            fastest[h] = max(fastest.get(h, 0.0), rate(a, b, h))
    return fastest


def above(samples: list[Sample], caps: dict[str, float], *, factor: float = ABOVE_FACTOR,
          span: float = ABOVE_WINDOW) -> dict[str, float]:
    """Seconds each capped host ran above `factor` × its cap: the samples cut into back-to-back windows of at
    least `span` seconds, each window's time (middle to middle, so none is counted twice) counted where its
    rate was above. Zero for a link that kept to its cap."""
    over = {h: 0.0 for h in caps}
    i = 0
    while i < len(samples):
        j = next((j for j in range(i + 1, len(samples)) if samples[j].after - samples[i].before >= span), None)
        if j is None:
            break
        for h, cap in caps.items():
            if rate(samples[i], samples[j], h) > factor * cap:
                over[h] += samples[j].middle - samples[i].middle
        i = j
    return over


class Sampler:
    """Samples `read` every `every` seconds on a thread of its own while in its `with`; `samples` after.
    A read that fails (the network going away at the end) is left out, not raised: the samples that came
    are the measurement."""

    def __init__(self, read: Callable[[], Counters], *, every: float = 0.1) -> None:
        self.read = read
        self.every = every
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.samples.append(take(self.read))
            self._stop.wait(self.every)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
