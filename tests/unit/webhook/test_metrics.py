"""What a review's outcome is counted as."""

from __future__ import annotations

from webhook.metrics import outcome_of
from webhook.rules import parse_rules
from webhook.review import review

RULES = parse_rules("""\
- name: dataset
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases:
    - ip: "10.106.122.174"
      hostnames: [www.cs.toronto.edu]
""")


def _review(labels: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": "ml",
                        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": labels},
                                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


def test_a_pod_a_rule_picks_is_patched_and_one_no_rule_picks_is_unmatched():
    picked = review(_review({"app.kubernetes.io/deploy-manager": "ksonnet"}), rules=RULES, cache_ip=None)
    assert outcome_of(picked) == "patched"
    other = review(_review({"app": "web"}), rules=RULES, cache_ip=None)
    assert outcome_of(other) == "unmatched"


def test_a_pod_a_rule_picks_but_that_cannot_be_patched_fails_open():
    """Allowed unchanged with a warning: the cache's IP is not known yet, so the pod starts without the cache."""
    no_ip = parse_rules("- {name: d, app: k, label: v, hostAliases: [{hostnames: [www.cs.toronto.edu]}]}\n")
    decision = review(_review({"k": "v"}), rules=no_ip, cache_ip=None)
    assert decision.response["response"]["allowed"] is True and not decision.ops
    assert outcome_of(decision) == "failed_open"
