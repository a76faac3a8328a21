"""What the in-process cost benchmarks share: this checkout against a reference one, each measured in a child
process of its own, alternating, and the least of each part reported. Not collected by pytest.

`bench/judge_cost.py` and `bench/front_miss_cost.py` time one part of a cold fill in Python (minimum over
batches); a child per checkout keeps their modules apart, and alternating the order every other round lets the
box's drift hit both alike.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent


def unpack(revision: str, into: str) -> Path:
    """The tree of git `revision` of this repository, unpacked in the folder `into` (`git archive`)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return Path(into)


def alternated(trees: dict[str, Path], rounds: int, run: Callable[[Path], dict]) -> dict[str, list[dict]]:
    """`run(tree)` of every tree per round, in the order given in even rounds and reversed in odd ones."""
    got: dict[str, list[dict]] = {name: [] for name in trees}
    for n in range(rounds):
        for name in (list(trees) if n % 2 == 0 else list(reversed(trees))):
            got[name].append(run(trees[name]))
    return got


def least(got: dict[str, list[dict]], parts: tuple[str, ...], *, reference: str) -> str:
    """Print, per part, the least time of the reference and of this checkout and the rounds this one was faster;
    the `ratios:` line (this checkout's least over the reference's, per part)."""
    ratios = []
    for part in parts:
        ref_us, this_us = (min(r[part] for r in got[name]) for name in ("reference", "this"))
        fewer = sum(t[part] < r[part] for r, t in zip(got["reference"], got["this"]))
        print(f"{part}: {reference} {ref_us:.2f} us, this checkout {this_us:.2f} us "
              f"({ref_us - this_us:+.2f} us saved); this checkout faster in {fewer} of {len(got['this'])} rounds")
        ratios.append(f"{part}={this_us / ref_us:.3f}")
    return "ratios: " + " ".join(ratios)
