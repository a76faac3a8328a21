"""Server-side apply's field ownership in the double (pure), against kube-apiserver's documented rules."""

from __future__ import annotations

import pytest

from testkit.kubeapi.apply import Conflict, apply, record_write


def sts(replicas=3, image="nezha:1", labels=None):
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "c", "labels": labels or {"a": "1"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}


def test_a_create_owns_every_field_it_set():
    owners = record_write({}, "helm", None, sts())
    assert ("spec", "replicas") in owners["helm"] and ("metadata", "labels", "a") in owners["helm"]


def test_another_writer_takes_only_the_fields_it_changed():
    owners = record_write({}, "helm", None, sts())
    owners = record_write(owners, "kubectl", sts(), sts(replicas=5))
    assert owners["kubectl"] == {("spec", "replicas")}
    assert ("spec", "replicas") not in owners["helm"]


def test_applying_a_different_value_of_a_field_another_manager_owns_conflicts_unless_forced():
    owners = record_write(record_write({}, "helm", None, sts()), "kubectl", sts(), sts(replicas=5))
    with pytest.raises(Conflict) as e:
        apply(sts(replicas=5), sts(replicas=3), owners, "helm", force=False)
    assert e.value.conflicts == [("kubectl", ("spec", "replicas"))]
    new, after = apply(sts(replicas=5), sts(replicas=3), owners, "helm", force=True)
    assert new["spec"]["replicas"] == 3 and "kubectl" not in after


def test_applying_the_value_already_there_shares_the_field():
    owners = record_write(record_write({}, "helm", None, sts()), "kubectl", sts(), sts(replicas=5))
    new, after = apply(sts(replicas=5), sts(replicas=5), owners, "helm", force=False)
    assert new["spec"]["replicas"] == 5
    assert ("spec", "replicas") in after["helm"] and ("spec", "replicas") in after["kubectl"]


def test_a_field_dropped_from_the_configuration_is_removed_unless_someone_else_owns_it():
    config = sts(labels={"a": "1", "b": "2"})
    new, owners = apply(config, config, record_write({}, "helm", None, config), "helm", force=False)
    without_b = sts(labels={"a": "1"})
    new, owners = apply(new, without_b, owners, "helm", force=False)
    assert new["metadata"]["labels"] == {"a": "1"}
    # A field helm stops setting after kubectl took it stays.
    owners = record_write(owners, "kubectl", new, sts(replicas=5))
    without_replicas = sts()
    del without_replicas["spec"]["replicas"]
    kept, _ = apply(sts(replicas=5), without_replicas, owners, "helm", force=False)
    assert kept["spec"]["replicas"] == 5
    # ...and one only helm owned goes: the reset Helm 4 users meet when a chart drops replicas.
    owned = record_write({}, "helm", None, sts())
    gone, _ = apply(sts(), without_replicas, owned, "helm", force=False)
    assert "replicas" not in gone["spec"]


def mwc(ca: str | None = None, timeout: int = 5) -> dict:
    config = {"service": {"name": "nezha-webhook", "namespace": "nezha"}}
    if ca is not None:
        config["caBundle"] = ca
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "nezha-webhook"},
            "webhooks": [{"name": "pods.webhook.nezha.io", "timeoutSeconds": timeout, "clientConfig": config}]}


def test_items_of_a_list_keyed_by_name_are_owned_field_by_field():
    """Helm owns a webhook's settings, the certificates Job its caBundle: an apply without it keeps it."""
    owners = record_write({}, "helm", None, mwc())
    owners = record_write(owners, "certs", mwc(), mwc(ca="Q0E="))
    assert owners["certs"] == {("webhooks", "[name=pods.webhook.nezha.io]", "clientConfig", "caBundle")}
    new, after = apply(mwc(ca="Q0E="), mwc(timeout=3), owners, "helm", force=False)
    hook = new["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == "Q0E=" and hook["timeoutSeconds"] == 3
    assert len(new["webhooks"]) == 1
