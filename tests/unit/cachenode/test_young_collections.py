"""The node's garbage collector runs its youngest pass less often (cachenode/cli.py)."""

from __future__ import annotations

import gc

from cachenode.cli import YOUNG_THRESHOLD, collect_young_less_often


def test_young_pass_every_young_threshold_allocations_older_generations_kept():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        collect_young_less_often()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
        assert YOUNG_THRESHOLD > 700  # Python's default, which cost a cold small fill about 25 us
        assert gc.isenabled()
    finally:
        gc.set_threshold(*before)
