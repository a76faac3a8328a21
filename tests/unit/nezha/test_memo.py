"""A bounded memo (nezha/memo.py): kept until full, then forgotten whole;
an entry over its size bound never kept."""

from __future__ import annotations

import pytest

from nezha.memo import keep


def test_entries_are_kept_until_the_count_bound():
    """Below its bound a memo keeps every entry, and `keep` gives back the value."""
    memo: dict[str, int] = {}
    for n in range(3):
        assert keep(memo, f"k{n}", n, 3) == n
    assert memo == {"k0": 0, "k1": 1, "k2": 2}
    assert type(memo) is dict  # still an exact dict: its sites' hits are plain look-ups


def test_a_full_memo_is_cleared_whole_before_the_next_entry():
    """At its bound, a new entry forgets every entry before it, not the oldest alone."""
    memo: dict[str, int] = {}
    for n in range(3):
        keep(memo, f"k{n}", n, 3)
    assert keep(memo, "new", 9, 3) == 9
    assert memo == {"new": 9}


def test_a_known_key_at_the_bound_clears_too():
    """The bound is on entries held, as each site tested it: a key kept again when full still clears."""
    memo = {"a": 1, "b": 2}
    keep(memo, "a", 3, 2)
    assert memo == {"a": 3}


@pytest.mark.parametrize("count_max", [1, 2, 5, 64])
def test_a_memo_never_holds_more_than_its_bound(count_max):
    """However many new keys come, the memo stays within its count bound."""
    memo: dict[int, int] = {}
    for n in range(10 * count_max + 3):
        keep(memo, n, n, count_max)
        assert 1 <= len(memo) <= count_max
        assert memo[n] == n


@pytest.mark.parametrize("size, kept", [(0, True), (255, True), (256, True), (257, False), (10_000, False)])
def test_an_entry_over_the_size_bound_is_given_back_but_not_kept(size, kept):
    """Up to `size_max` an entry is kept; over it, returned and not kept."""
    memo = {"old": 0}
    assert keep(memo, "k", 1, 4, size, 256) == 1
    assert ("k" in memo) is kept
    assert memo["old"] == 0


def test_a_refused_entry_does_not_clear_a_full_memo():
    """An entry too long to keep leaves a full memo as it was: nothing is forgotten for it."""
    memo = {"a": 1, "b": 2}
    keep(memo, "long", 3, 2, 9, 8)
    assert memo == {"a": 1, "b": 2}


def test_without_a_size_bound_any_size_is_kept():
    """A site with no length bound passes none: every entry is kept."""
    memo: dict[str, int] = {}
    keep(memo, "k", 1, 2, 10**12)
    assert memo == {"k": 1}
