"""Which namespaces get a copy of the CA bundle, and when (controller/trust.py, pure)."""

from __future__ import annotations

from controller.trust import MANAGED_BY, Publication, publications

SOURCE = {"metadata": {"name": "nezha-ca", "namespace": "nezha"}, "data": {"ca.crt": "A", "ca-bundle.crt": "RA"}}


def ns(name: str, **extra) -> dict:
    return {"metadata": {"name": name, **extra.pop("metadata", {})}, **extra}


def copy(data: dict, *, managed: bool = True, version: str = "7") -> dict:
    labels = {MANAGED_BY[0]: MANAGED_BY[1]} if managed else {}
    return {"metadata": {"name": "nezha-ca", "labels": labels, "resourceVersion": version}, "data": data}


def decide(namespaces, copies, source=SOURCE):
    return publications(source=source, source_namespace="nezha", namespaces={n["metadata"]["name"]: n
                                                                              for n in namespaces}, copies=copies)


def test_every_namespace_but_the_sources_and_the_control_planes_gets_a_copy():
    writes, foreign = decide([ns("nezha"), ns("ml"), ns("team-b"), ns("kube-system"), ns("kube-public"),
                              ns("kube-node-lease")], {"nezha": SOURCE})
    assert writes == [Publication("ml", "create"), Publication("team-b", "create")] and foreign == []


def test_a_copy_that_differs_from_the_source_is_replaced_at_its_version_and_an_equal_one_is_left():
    writes, _ = decide([ns("ml"), ns("team-b")], {"nezha": SOURCE, "ml": copy({"ca.crt": "OLD"}, version="42"),
                                                  "team-b": copy(dict(SOURCE["data"]))})
    assert writes == [Publication("ml", "replace", "42")]


def test_a_users_configmap_of_that_name_is_left_alone_and_named():
    writes, foreign = decide([ns("ml")], {"nezha": SOURCE, "ml": copy({"mine": "x"}, managed=False)})
    assert writes == [] and foreign == ["ml"]


def test_nothing_is_written_without_a_source_or_into_a_terminating_namespace():
    assert decide([ns("ml")], {}, source=None) == ([], [])
    assert decide([ns("ml")], {}, source={"metadata": {}, "data": {}}) == ([], [])
    terminating = [ns("a", status={"phase": "Terminating"}), ns("b", metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"})]
    assert decide(terminating, {"nezha": SOURCE}) == ([], [])
