"""Values the schema accepts one by one but that cannot run together are refused at render time, naming them.

Each case renders with the real `helm`: a `helm template` or `helm install`
that succeeded here would create a cache that fails later, in the cluster.
"""

from __future__ import annotations

import pytest

from tests.integration.chart.render import RenderError, find, render


def refusal(sets: list[str]) -> str:
    with pytest.raises(RenderError) as e:
        render(sets=sets)
    return str(e.value)


def test_a_tls_port_equal_to_the_http_port_is_refused_naming_both():
    message = refusal(["cache.port=9000", "cache.tlsPort=9000"])
    assert "cache.tlsPort (9000)" in message and "cache.port (9000)" in message


@pytest.mark.parametrize("capacity,size,shown", [
    ("60GiB", "50Gi", "60GiB"),
    # Decimal against binary: 54 GB is 54e9 bytes, 50 GiB 53.7e9.
    ("54G", "50Gi", "54G"),
    ("1.5TiB", "1500G", "1.5TiB"),
    ("2 gib", "2G", "2 gib"),
])
def test_a_capacity_larger_than_the_disk_is_refused_naming_both(capacity, size, shown):
    message = refusal([f"cache.capacity={capacity}", f"cache.storage.size={size}"])
    assert f"cache.capacity ({shown}" in message and f"cache.storage.size ({size}" in message


@pytest.mark.parametrize("capacity,size", [
    ("50GiB", "50Gi"),
    ("1000000B", "1M"),
    ("0.5 TB", "500G"),
])
def test_a_capacity_equal_to_the_disk_is_refused_asking_for_headroom(capacity, size):
    """The README asks for headroom: the file system takes some of the volume, and a download without
    Content-Length passes the capacity for a moment in its temporary file."""
    message = refusal([f"cache.capacity={capacity}", f"cache.storage.size={size}"])
    assert f"cache.capacity ({capacity} = " in message and f"cache.storage.size ({size} = " in message
    assert "must be below" in message and "headroom" in message


@pytest.mark.parametrize("capacity,size", [
    ("45GiB", "50Gi"),
    ("53G", "50Gi"),
    ("49GiB", "50Gi"),
    ("999999B", "1M"),
    ("900Mi", "1G"),
    ("1T", "1Ti"),
    ("0.4 TB", "500G"),
])
def test_a_capacity_within_the_disk_renders(capacity, size):
    objects = render(sets=[f"cache.capacity={capacity}", f"cache.storage.size={size}"])
    (c,) = find(objects, "StatefulSet", "nezha-cache")["spec"]["template"]["spec"]["containers"]
    assert f"--capacity={capacity}" in c["args"]


def test_a_budget_that_lets_a_drain_take_every_owner_of_a_key_is_refused_naming_both():
    message = refusal(["cache.pdb.maxUnavailable=2"])
    assert "cache.pdb.maxUnavailable (2)" in message and "cache.replicasPerKey (2)" in message
    message = refusal(["cache.replicasPerKey=3", "cache.pdb.maxUnavailable=4"])
    assert "cache.pdb.maxUnavailable (4)" in message and "cache.replicasPerKey (3)" in message


def test_a_percentage_budget_is_refused_because_it_grows_with_the_cluster():
    message = refusal(["cache.pdb.maxUnavailable=10%"])
    assert 'cache.pdb.maxUnavailable ("10%")' in message and "cache.replicasPerKey (2)" in message


@pytest.mark.parametrize("per_key,budget", [(2, 1), (3, 2), (3, 0)])
def test_a_budget_below_the_owners_per_key_renders(per_key, budget):
    objects = render(sets=[f"cache.replicasPerKey={per_key}", f"cache.pdb.maxUnavailable={budget}"])
    assert find(objects, "PodDisruptionBudget", "nezha-cache")["spec"]["maxUnavailable"] == budget


def test_with_one_owner_per_key_a_budget_of_one_renders_so_drains_still_proceed():
    """No budget can keep a second copy that does not exist; 0 would only block every drain."""
    objects = render(sets=["cache.replicasPerKey=1"])
    assert find(objects, "PodDisruptionBudget", "nezha-cache")["spec"]["maxUnavailable"] == 1
    message = refusal(["cache.replicasPerKey=1", "cache.pdb.maxUnavailable=2"])
    assert "cache.pdb.maxUnavailable (2) must be at most 1" in message and "cache.replicasPerKey (1)" in message


def test_a_negative_budget_is_refused_by_the_schema_naming_it():
    assert "/cache/pdb/maxUnavailable" in refusal(["cache.pdb.maxUnavailable=-1"])


@pytest.mark.parametrize("per_key,replicas", [(3, 2), (2, 1), (5, 3)])
def test_more_owners_per_key_than_cache_nodes_is_refused_naming_both(per_key, replicas):
    message = refusal([f"cache.replicasPerKey={per_key}", f"cache.replicas={replicas}",
                       "cache.pdb.maxUnavailable=1"])
    assert f"cache.replicasPerKey ({per_key}) must not exceed cache.replicas ({replicas})" in message


@pytest.mark.parametrize("per_key,replicas", [(1, 1), (2, 2), (3, 5)])
def test_owners_per_key_up_to_the_node_count_render(per_key, replicas):
    objects = render(sets=[f"cache.replicasPerKey={per_key}", f"cache.replicas={replicas}",
                           "cache.pdb.maxUnavailable=1"])
    sts = find(objects, "StatefulSet", "nezha-cache")
    assert sts["spec"]["replicas"] == replicas
    assert sts["metadata"]["annotations"]["nezha.io/replicas-per-key"] == str(per_key)
