"""The shipped MutatingWebhookConfiguration: fails open, fast, without side effects, out of the control plane's way."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from testkit.kubeapi.admission import rule_matches
from testkit.kubeapi.resources import BY_PATH, matches, selector_terms
from testkit.kubeapi.writes import validate_webhook_configuration

MANIFEST = Path(__file__).resolve().parents[3] / "webhook" / "manifests" / "mutatingwebhookconfiguration.yaml"
CONFIGURATION = yaml.safe_load(MANIFEST.read_text())
HOOKS = CONFIGURATION["webhooks"]


def test_the_manifest_is_a_valid_v1_mutating_webhook_configuration():
    assert CONFIGURATION["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert CONFIGURATION["kind"] == "MutatingWebhookConfiguration" and HOOKS
    kubernetes_validate.validate(CONFIGURATION, kubernetes_validate.latest_version(), strict=True)
    validate_webhook_configuration(BY_PATH[("admissionregistration.k8s.io", "v1",
                                            "mutatingwebhookconfigurations")], CONFIGURATION)


@pytest.mark.parametrize("hook", HOOKS, ids=[h["name"] for h in HOOKS])
def test_every_webhook_fails_open_within_five_seconds_without_side_effects(hook):
    """A broken or slow webhook must never stop a training job; reinvocation is safe because patches are idempotent."""
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert "v1" in hook["admissionReviewVersions"]
    assert hook["reinvocationPolicy"] == "IfNeeded"


@pytest.mark.parametrize("namespace,sent", [("kube-system", False), ("nezha", False), ("ml", True),
                                            ("default", True)])
def test_the_namespace_selector_keeps_kube_system_and_nezhas_own_namespace_out(namespace, sent):
    """Matched on the label kube-apiserver sets on every namespace, so a user cannot drop it."""
    labels = {"kubernetes.io/metadata.name": namespace}
    for hook in HOOKS:
        assert matches(selector_terms(hook.get("namespaceSelector")), labels) is sent


@pytest.mark.parametrize("group,version,plural", [("", "v1", "pods"), ("batch", "v1", "jobs"),
                                                  ("apps", "v1", "deployments"), ("apps", "v1", "statefulsets")])
def test_pods_and_the_templates_of_jobs_deployments_and_statefulsets_are_sent_on_create_only(group, version,
                                                                                             plural):
    res = BY_PATH[(group, version, plural)]
    [hook] = HOOKS
    assert any(rule_matches(rule, res, "CREATE") for rule in hook["rules"])
    assert not any(rule_matches(rule, res, op) for rule in hook["rules"] for op in ("UPDATE", "DELETE"))
