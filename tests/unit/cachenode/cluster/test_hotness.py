"""When a key becomes hot on a node: `reads` relayed reads within `window` seconds (cachenode/cluster/hotness.py)."""

from __future__ import annotations

import pytest

from cachenode.cluster.hotness import HotReads


def test_key_is_hot_on_its_nth_read_within_the_window():
    """The third read within ten seconds makes the key hot, not the second."""
    hot = HotReads(reads=3, window=10.0)
    assert [hot.seen("k", t) for t in (0.0, 4.0, 9.0)] == [False, False, True]


def test_reads_spread_wider_than_the_window_never_make_a_key_hot():
    """Reads five seconds apart never put three within a window of eight."""
    hot = HotReads(reads=3, window=8.0)
    assert not any(hot.seen("k", t) for t in (0.0, 5.0, 10.0, 15.0, 20.0))


def test_window_slides_a_burst_after_a_lull_is_hot():
    """Old reads fall out of the window; a later burst counts on its own."""
    hot = HotReads(reads=3, window=2.0)
    assert [hot.seen("k", t) for t in (0.0, 100.0, 100.5, 101.0)] == [False, False, False, True]


def test_read_exactly_at_the_window_edge_counts():
    hot = HotReads(reads=2, window=5.0)
    assert [hot.seen("k", t) for t in (0.0, 5.0)] == [False, True]


def test_keys_are_counted_apart():
    hot = HotReads(reads=2, window=10.0)
    assert [hot.seen(k, t) for k, t in (("a", 0.0), ("b", 1.0), ("a", 2.0), ("c", 3.0))] == [False, False, True,
                                                                                              False]


def test_zero_reads_turns_hot_copies_off_and_remembers_nothing():
    hot = HotReads(reads=0, window=10.0)
    assert not hot.enabled
    assert not any(hot.seen("k", float(t)) for t in range(100))
    assert len(hot) == 0


def test_memory_is_bounded_least_recently_read_key_dropped_first():
    """With room for two keys, a third drops the key read least recently, whose count starts again."""
    hot = HotReads(reads=2, window=100.0, keys=2)
    hot.seen("a", 0.0)
    hot.seen("b", 1.0)
    hot.seen("a", 2.0)  # a is now the most recent; b the least
    hot.seen("c", 3.0)  # drops b
    assert len(hot) == 2
    assert not hot.seen("b", 4.0)  # b's first read counted again
    assert hot.seen("c", 5.0)


def test_forget_starts_a_key_count_again():
    hot = HotReads(reads=2, window=10.0)
    hot.seen("k", 0.0)
    hot.forget("k")
    assert not hot.seen("k", 1.0)
    assert hot.seen("k", 2.0)


def test_stays_hot_while_reads_keep_coming():
    hot = HotReads(reads=2, window=1.0)
    assert [hot.seen("k", t) for t in (0.0, 0.5, 1.0, 1.4)] == [False, True, True, True]


@pytest.mark.parametrize("kwargs, message", [
    ({"reads": -1, "window": 1.0}, "reads (-1)"),
    ({"reads": 1, "window": 0.0}, "window (0)"),
    ({"reads": 1, "window": 1.0, "keys": 0}, "keys (0)"),
])
def test_bad_settings_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HotReads(**kwargs)
