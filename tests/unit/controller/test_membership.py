"""Which pods are ring members, and where peers reach them: decided from literal API objects."""

from __future__ import annotations

import pytest

from controller.membership import is_member, members, ordinal, pod_selector

STS = {"metadata": {"name": "nezha-cache"},
       "spec": {"serviceName": "nezha-cache-peers", "selector": {"matchLabels": {"app": "nezha-cache"}}}}


def pod(name="nezha-cache-0", *, ready="True", deleting=False, ip="10.0.0.5", port=("http", 8080)):
    p = {"metadata": {"name": name}, "spec": {"containers": [{"name": "cache", "ports": []}]},
         "status": {"conditions": [{"type": "Ready", "status": ready}]}}
    if port:
        p["spec"]["containers"][0]["ports"].append({"name": port[0], "containerPort": port[1]})
    if ip:
        p["status"]["podIP"] = ip
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-11-23T18:00:00Z"
    return p


@pytest.mark.parametrize("p,member", [
    (pod(), True),
    (pod(ready="False"), False),
    (pod(ready="Unknown"), False),
    (pod(deleting=True), False),  # terminating: it must stop owning keys now
    ({"metadata": {"name": "x"}, "status": {}}, False),
    ({"metadata": {"name": "x"}}, False),
])
def test_a_member_is_ready_and_not_being_deleted(p, member):
    assert is_member(p) is member


@pytest.mark.parametrize("mode,p,address", [
    ("dns", pod(), "nezha-cache-0.nezha-cache-peers.ns.svc:8080"),
    ("dns", pod(port=("http", 9000)), "nezha-cache-0.nezha-cache-peers.ns.svc:9000"),
    ("dns", pod(port=("metrics", 9000)), "nezha-cache-0.nezha-cache-peers.ns.svc:7000"),  # --peer-port
    ("dns", pod(port=None), "nezha-cache-0.nezha-cache-peers.ns.svc:7000"),
    ("pod-ip", pod(ip="127.0.0.11"), "127.0.0.11:8080"),
    ("pod-ip", pod(ip=None), None),  # no IP yet: not addressable, not a member
])
def test_addresses_follow_the_peer_address_mode_and_the_port_named_http(mode, p, address):
    got = members([p], statefulset=STS, namespace="ns", peer_address=mode, peer_port=7000)
    assert got == ({} if address is None else {"nezha-cache-0": address})


@pytest.mark.parametrize("selector,text", [
    ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]},
                                                        {"key": "old", "operator": "DoesNotExist"}]},
     "a=1,tier in (x,y),!old"),
    ({}, None),
])
def test_pods_are_selected_by_the_statefulsets_own_selector(selector, text):
    assert pod_selector({"spec": {"selector": selector}}) == text


@pytest.mark.parametrize("name,n", [("nezha-cache-0", 0), ("nezha-cache-12", 12), ("nezha-cache-x", None),
                                    ("other-1", None), ("nezha-cache-", None)])
def test_ordinal_of_a_pod_name(name, n):
    assert ordinal(name, "nezha-cache") == n


@pytest.mark.parametrize("replicas,expected", [
    (3, ["nezha-cache-0", "nezha-cache-1", "nezha-cache-2"]),
    (2, ["nezha-cache-0", "nezha-cache-1"]),  # a scale-down: nezha-cache-2 leaves the ring at once
    (0, []),
])
def test_pods_a_scale_down_removes_leave_the_ring_while_they_still_run(replicas, expected):
    sts = {**STS, "spec": {**STS["spec"], "replicas": replicas}}
    pods = [pod(f"nezha-cache-{i}") for i in range(3)]
    assert sorted(members(pods, statefulset=sts, namespace="ns", peer_address="dns", peer_port=8080)) == expected
