"""webhook/gate.py: a workload that spreads its prefetch marks its pod template, and its pods are created gated."""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch
import pytest

from webhook.review import review
from webhook.rules import parse_rules

RULES = parse_rules("""
- name: dataset
  app: app
  label: train
  hostAliases: [{ip: 10.0.0.7, hostnames: [www.cs.toronto.edu]}]
""")
SPREAD = {"nezha.io/prefetch": "hf://org/model", "nezha.io/prefetch-spread": "all"}


def deployment(annotations=SPREAD, template_meta=None, name="serve"):
    meta = {"name": name, "annotations": dict(annotations)} if name else {"generateName": "serve-",
                                                                         "annotations": dict(annotations)}
    template = {"spec": {"containers": [{"name": "c", "image": "vllm"}]}}
    if template_meta is not None:
        template["metadata"] = template_meta
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"selector": {"matchLabels": {"app": "serve"}}, "template": template}}


def admitted(obj, kind=None):
    kind = kind or obj["kind"]
    req = {"uid": "u-1", "kind": {"kind": kind}, "namespace": "ml", "operation": "CREATE", "object": obj}
    d = review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}, rules=RULES,
               cache_ip=None)
    resp = d.response["response"]
    ops = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
    return jsonpatch.apply_patch(copy.deepcopy(obj), ops), resp.get("warnings", [])


@pytest.mark.parametrize("template_meta", [None, {}, {"labels": {"app": "serve"}},
                                          {"annotations": {"team": "a"}}, {"labels": {"app": "train"}}])
def test_a_workload_that_spreads_names_itself_on_its_pod_template_whatever_the_template_holds(template_meta):
    """The last case also matches a rule, whose ops make the template's annotations first."""
    out, warnings = admitted(deployment(template_meta=copy.deepcopy(template_meta)))
    annotations = out["spec"]["template"]["metadata"]["annotations"]
    assert annotations["nezha.io/prefetch-for"] == "Deployment/serve"
    assert {k: v for k, v in annotations.items() if k != "nezha.io/prefetch-for"} == \
        {**((template_meta or {}).get("annotations") or {}),
         **({"nezha.io/injected": "dataset"} if template_meta == {"labels": {"app": "train"}} else {})}
    assert out["metadata"] == deployment()["metadata"], "the workload's own metadata is left alone"
    assert "schedulingGates" not in out["spec"]["template"]["spec"], "the template holds no gate: its pods get it"
    assert warnings == []


@pytest.mark.parametrize("annotations", [{"nezha.io/prefetch": "hf://org/model"},
                                         {"nezha.io/prefetch-spread": "all"},
                                         {**SPREAD, "nezha.io/prefetch-spread": "none"}])
def test_a_workload_that_does_not_spread_a_prefetch_is_left_as_it_is(annotations):
    obj = deployment(annotations)
    assert admitted(obj) == (obj, [])


def test_a_workload_named_by_generate_name_is_not_marked_and_says_why():
    obj = deployment(name=None)
    out, warnings = admitted(obj)
    assert out == obj
    assert warnings == ["nezha: nezha.io/prefetch-spread: all on a Deployment created by generateName: its pods are "
                        "not held until the spread is done (their workload has no name yet)"]


def pod(meta):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "vllm"}]}}


@pytest.mark.parametrize("spec_gates", [None, [{"name": "example.com/quota"}]])
def test_a_pod_of_such_a_workload_is_created_with_the_gate_and_the_label_the_controller_watches(spec_gates):
    obj = pod({"generateName": "serve-", "labels": {"app": "serve"},
               "annotations": {"nezha.io/prefetch-for": "Deployment/serve"}})
    if spec_gates is not None:
        obj["spec"]["schedulingGates"] = spec_gates
    out, _ = admitted(obj)
    assert out["spec"]["schedulingGates"] == (spec_gates or []) + [{"name": "nezha.io/prefetch"}]
    assert out["metadata"]["labels"] == {"app": "serve", "nezha.io/prefetch-gated": "true"}
    again, _ = admitted(out)
    assert again == out, "a reinvocation adds nothing"


@pytest.mark.parametrize("annotations", [{}, {"nezha.io/prefetch-for": "ConfigMap/x"},
                                         {"nezha.io/prefetch-for": "Deployment/"}])
def test_other_pods_are_not_gated(annotations):
    obj = pod({"name": "p", "annotations": annotations})
    out, _ = admitted(obj)
    assert "schedulingGates" not in out["spec"] and "labels" not in out["metadata"]


def test_a_pod_without_labels_gets_the_label_map():
    out, _ = admitted(pod({"name": "p", "annotations": {"nezha.io/prefetch-for": "Job/train"}}))
    assert out["metadata"]["labels"] == {"nezha.io/prefetch-gated": "true"}
