"""controller/workloads.py: which custom workload kinds a discovery document serves."""

from __future__ import annotations

from controller.workloads import JOB_SET, KINDS, LEADER_WORKER_SET, served


def group(name: str, *versions: str) -> dict:
    return {"name": name, "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{name}/{versions[0]}", "version": versions[0]}}


def test_a_custom_kind_is_served_when_its_group_serves_the_version_known_here():
    document = {"groups": [group("apps", "v1"), group("leaderworkerset.x-k8s.io", "v1"),
                           group("jobset.x-k8s.io", "v1alpha2", "v1alpha1")]}
    assert served(document) == {LEADER_WORKER_SET, JOB_SET}


def test_an_absent_group_or_another_version_serves_nothing():
    assert served({"groups": [group("apps", "v1")]}) == set()
    assert served({"groups": [group("jobset.x-k8s.io", "v1alpha1")]}) == set()
    assert served({}) == set()


def test_the_built_in_kinds_are_never_left_to_discovery():
    assert {k.name for k in KINDS if not k.custom} == {"Job", "Deployment", "StatefulSet"}
