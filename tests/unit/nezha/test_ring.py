"""The ring: exact owners under an injected hash, and the properties the
cluster relies on under the real one (balance, movement, determinism)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nezha.ring import Ring

ROOT = Path(__file__).resolve().parents[3]
KEYS = [f"http://www.cs.toronto.edu/~kriz/part-{i}.tar.gz" for i in range(100_000)]


def digits(label: str) -> int:
    """Identity-like hash: point "6-1" is 61, key "45" is 45 (as in groupcache's test)."""
    return int(label.replace("-", ""))


# Points with vnodes=3: node "2" -> 20 21 22, "4" -> 40 41 42, "6" -> 60 61 62.
# A key belongs to the first point strictly greater than its hash.
@pytest.mark.parametrize(("key", "n", "owners"), [
    ("19", 1, ["2"]),
    ("20", 1, ["2"]),   # equal to a point: the next point (21) owns it
    ("22", 1, ["4"]),
    ("23", 3, ["4", "6", "2"]),
    ("45", 2, ["6", "2"]),
    ("62", 1, ["2"]),   # past the last point: wraps to the first
    ("99", 3, ["2", "4", "6"]),
    ("45", 5, ["6", "2", "4"]),  # never more owners than nodes
    ("45", 0, []),
])
def test_owners_follow_the_points_clockwise(key, n, owners):
    ring = Ring({"6": 1, "4": 1, "2": 1}, vnodes=3, hash_fn=digits)
    assert ring.owners(key, n) == owners


def test_adding_a_node_takes_only_the_keys_before_its_points():
    before = Ring({"2": 1, "4": 1, "6": 1}, vnodes=3, hash_fn=digits)
    after = Ring({"2": 1, "4": 1, "6": 1, "8": 1}, vnodes=3, hash_fn=digits)
    assert before.owners("65", 1) == ["2"]
    assert after.owners("65", 2) == ["8", "2"]
    assert [after.owners(k, 1) for k in ("19", "23", "45")] == [["2"], ["4"], ["6"]]


def test_weight_multiplies_a_nodes_points():
    ring = Ring({"2": 2, "4": 1}, vnodes=3, hash_fn=digits)  # "2" -> 20..25
    assert ring.owners("24", 2) == ["2", "4"]
    assert ring.owners("25", 2) == ["4", "2"]


def test_colliding_points_go_to_the_same_node_whatever_the_input_order():
    table = {"a-0": 10, "a-1": 30, "b-0": 10, "b-1": 20, "k": 5}
    one = Ring({"a": 1, "b": 1}, vnodes=2, hash_fn=table.__getitem__)
    two = Ring({"b": 1, "a": 1}, vnodes=2, hash_fn=table.__getitem__)
    assert one.owners("k", 2) == two.owners("k", 2) == ["b", "a"]
    assert one == two


def test_empty_ring_has_no_owners():
    assert Ring.empty().owners("anything", 3) == []
    assert Ring({}).primary("anything") is None
    assert not Ring.empty()


@pytest.mark.parametrize(("nodes", "message"), [
    ({"a": 0}, "weight of ring node 'a' must be a positive int, got 0"),
    ({"a": 1.5}, "weight of ring node 'a' must be a positive int, got 1.5"),
    ({"": 1}, "ring node id '' must be a non-empty string"),
])
def test_bad_membership_is_refused_naming_the_node(nodes, message):
    with pytest.raises(ValueError) as e:
        Ring(nodes)
    assert str(e.value) == message


def test_ring_is_read_only():
    ring = Ring({"a": 1})
    with pytest.raises(TypeError):
        ring.nodes["b"] = 1  # type: ignore[index]


node_ids = st.text(alphabet="abc-0123", min_size=1, max_size=6)
memberships = st.dictionaries(node_ids, st.integers(1, 3), max_size=8)


@settings(max_examples=60, deadline=None)
@given(nodes=memberships, keys=st.lists(st.text(max_size=30), min_size=1, max_size=20), n=st.integers(0, 10))
def test_owners_are_distinct_members_and_never_more_than_the_nodes(nodes, keys, n):
    ring = Ring(nodes, vnodes=20)
    for key in keys:
        owners = ring.owners(key, n)
        assert len(owners) == min(n, len(nodes))
        assert len(set(owners)) == len(owners)
        assert set(owners) <= set(nodes)
        # More replicas only append: the primary never changes with n.
        assert ring.owners(key, max(n - 1, 0)) == owners[: max(n - 1, 0)]


@pytest.mark.parametrize("n_nodes", [3, 5, 10])
def test_keys_spread_evenly_over_nodes(n_nodes):
    ring = Ring({f"nezha-cache-{i}": 1 for i in range(n_nodes)})
    counts = Counter(ring.primary(k) for k in KEYS)
    mean = len(KEYS) / n_nodes
    print(f"nodes={n_nodes} max/mean={max(counts.values()) / mean:.3f} min/mean={min(counts.values()) / mean:.3f}")
    assert len(counts) == n_nodes
    assert max(counts.values()) / mean < 1.2
    assert min(counts.values()) / mean > 0.8


def test_weights_skew_the_share_in_proportion():
    ring = Ring({"big": 3, "small": 1})
    counts = Counter(ring.primary(k) for k in KEYS[:40_000])
    share = counts["big"] / 40_000
    print(f"weight 3:1 share of big={share:.3f}")
    assert 0.70 < share < 0.80


@pytest.mark.parametrize("n_nodes", [3, 5, 10])
def test_adding_a_node_moves_about_one_nth_of_keys_and_only_to_it(n_nodes):
    nodes = {f"nezha-cache-{i}": 1 for i in range(n_nodes)}
    new = f"nezha-cache-{n_nodes}"
    before, after = Ring(nodes), Ring({**nodes, new: 1})
    moved = [k for k in KEYS if before.primary(k) != after.primary(k)]
    fraction, ideal = len(moved) / len(KEYS), 1 / (n_nodes + 1)
    print(f"add: nodes={n_nodes}->{n_nodes + 1} moved={fraction:.3f} ideal={ideal:.3f}")
    assert {after.primary(k) for k in moved} == {new}
    assert 0.7 * ideal < fraction < 1.3 * ideal


@pytest.mark.parametrize("n_nodes", [3, 5, 10])
def test_removing_a_node_moves_only_its_keys(n_nodes):
    nodes = {f"nezha-cache-{i}": 1 for i in range(n_nodes)}
    gone = "nezha-cache-1"
    before = Ring(nodes)
    after = Ring({n: w for n, w in nodes.items() if n != gone})
    moved = [k for k in KEYS if before.primary(k) != after.primary(k)]
    fraction, ideal = len(moved) / len(KEYS), 1 / n_nodes
    print(f"remove: nodes={n_nodes}->{n_nodes - 1} moved={fraction:.3f} ideal={ideal:.3f}")
    assert {before.primary(k) for k in moved} == {gone}
    assert 0.7 * ideal < fraction < 1.3 * ideal
    # The second owner of a removed node's key becomes its primary: a replica
    # already holds it, so removal costs no origin fetch.
    assert all(after.primary(k) == before.owners(k, 2)[1] for k in moved[:2000])


def test_two_processes_compute_the_same_owners():
    nodes = {"nezha-cache-0": 1, "nezha-cache-1": 2, "nezha-cache-2": 1, "nezha-cache-3": 1}
    keys = KEYS[:3000]
    script = (
        "import json, sys\n"
        "from nezha.ring import Ring\n"
        "nodes, keys = json.load(sys.stdin)\n"
        "ring = Ring(nodes)\n"
        "print(json.dumps([ring.owners(k, 3) for k in keys]))\n"
    )
    results = []
    for seed in ("1", "2"):  # different str hashing in each process
        out = subprocess.run([sys.executable, "-c", script], input=json.dumps([nodes, keys]), text=True,
                             capture_output=True, check=True, cwd=ROOT,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        results.append(json.loads(out.stdout))
    ring = Ring(dict(reversed(list(nodes.items()))))
    assert results[0] == results[1] == [ring.owners(k, 3) for k in keys]
