"""webhook.review: AdmissionReview v1 in, response out; malformed reviews raise."""

from __future__ import annotations

import base64
import json

import jsonpatch
import pytest

from nezha.errors import ReviewError
from webhook.rules import parse_rules
from webhook.review import review

RULES = parse_rules("""
- name: dataset
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases: [{ip: 10.0.0.7, hostnames: [www.cs.toronto.edu]}]
""")
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "p", "labels": {"app.kubernetes.io/deploy-manager": "ksonnet"}},
       "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def body(obj=POD, **request):
    req = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "ml",
           "operation": "CREATE", "object": obj, **request}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def test_a_matching_pod_gets_a_base64_json_patch_and_its_uid_back():
    d = review(body(), rules=RULES, cache_ip=None)
    resp = d.response["response"]
    assert d.response["apiVersion"] == "admission.k8s.io/v1" and d.response["kind"] == "AdmissionReview"
    assert resp["uid"] == "u-1" and resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(POD, json.loads(base64.b64decode(resp["patch"])))
    assert patched["spec"]["hostAliases"] == [{"ip": "10.0.0.7", "hostnames": ["www.cs.toronto.edu"]}]
    assert d.rules == ["dataset"] and "warnings" not in resp


def test_a_pod_no_rule_matches_is_allowed_without_a_patch():
    resp = review(body({**POD, "metadata": {"name": "p"}}), rules=RULES, cache_ip=None).response["response"]
    assert resp == {"uid": "u-1", "allowed": True}


def test_an_object_that_cannot_be_patched_is_allowed_unchanged_with_a_warning():
    resp = review(body({"kind": "Pod", "metadata": {}, "spec": "nope"}), rules=RULES,
                  cache_ip=None).response["response"]
    assert resp["allowed"] is True and "patch" not in resp
    assert resp["warnings"] == ["nezha: not patched: Pod has no pod spec at /spec"]


def test_updates_pass_through_because_pod_specs_are_immutable():
    resp = review(body(operation="UPDATE"), rules=RULES, cache_ip=None).response["response"]
    assert resp == {"uid": "u-1", "allowed": True}


def test_job_reviews_patch_the_pod_template():
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"metadata": {"labels": POD["metadata"]["labels"]},
                                 "spec": {**POD["spec"], "restartPolicy": "Never"}}}}
    d = review(body(job, kind={"group": "batch", "version": "v1", "kind": "Job"}), rules=RULES, cache_ip=None)
    patched = jsonpatch.apply_patch(job, d.ops)
    assert patched["spec"]["template"]["spec"]["hostAliases"][0]["ip"] == "10.0.0.7"


@pytest.mark.parametrize("bad,why", [
    ([], "must be a JSON object, got list"),
    ("x", "must be a JSON object, got str"),
    ({**body(), "apiVersion": "admission.k8s.io/v1beta1"}, "apiVersion must be admission.k8s.io/v1"),
    ({**body(), "kind": "Pod"}, "kind must be AdmissionReview, got 'Pod'"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request is missing"),
    ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}, "request must be an object"),
    (body(uid=None), "request.uid must be a non-empty string"),
    (body(uid=""), "request.uid must be a non-empty string"),
    (body(obj=None), "request.object is missing"),
    (body(obj=[1]), "request.object must be an object"),
])
def test_malformed_reviews_raise_review_error_saying_what_is_wrong(bad, why):
    with pytest.raises(ReviewError, match=why):
        review(bad, rules=RULES, cache_ip=None)


ENV_RULES = parse_rules("""
- name: proxy
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  mode: env
  hostAliases: [{ip: 10.0.0.7, hostnames: [www.cs.toronto.edu]}]
""")


def with_container(**fields):
    return {**POD, "spec": {"containers": [{"name": "c", "image": "busybox", **fields}]}}


@pytest.mark.parametrize("obj,warning", [
    ({**POD, "spec": {**POD["spec"], "hostAliases": [{"ip": "1.1.1.1", "hostnames": [["x"]]}]}},
     "nezha: not patched: /spec/hostAliases/0/hostnames/0 is a list, not a hostname"),
    (with_container(env=[{"name": ["x"], "value": "1"}]),
     "nezha: not patched: /spec/containers/0/env/0/name is a list, not a variable name"),
], ids=["hostnames-of-lists", "env-name-a-list"])
def test_an_ill_typed_object_is_allowed_unchanged_with_a_warning_naming_the_field(obj, warning):
    resp = review(body(obj), rules=RULES + ENV_RULES, cache_ip=None, proxy_url="http://cache:80").response
    assert resp["response"] == {"uid": "u-1", "allowed": True, "warnings": [warning]}
    json.dumps(resp)


def test_a_container_with_env_from_is_named_in_the_reviews_warnings():
    d = review(body(with_container(envFrom=[{"secretRef": {"name": "proxy"}}])), rules=ENV_RULES, cache_ip=None,
               proxy_url="http://cache:80")
    assert d.response["response"]["warnings"] == [
        "nezha: container 'c' has envFrom, which may set proxy variables the webhook cannot see; its proxy "
        "variables are left alone"]
    patched = jsonpatch.apply_patch(with_container(envFrom=[{"secretRef": {"name": "proxy"}}]), d.ops)
    assert "env" not in patched["spec"]["containers"][0] and patched["spec"]["hostAliases"]


def deep(levels):
    value = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_kind_name_and_namespace_of_other_types_are_ignored_not_stringified():
    """str() of a deep value would be long, or raise RecursionError; only strings are used."""
    obj = {**POD, "kind": deep(900), "metadata": {**POD["metadata"], "name": deep(900), "namespace": {"a": 1}}}
    d = review(body(obj, kind={"kind": deep(900)}, name=deep(900), namespace=["ml"]), rules=RULES, cache_ip=None)
    assert (d.kind, d.name, d.namespace) == ("None", None, None)
    assert d.response["response"]["warnings"] == [
        "nezha: not patched: kind 'None' is not one the webhook patches "
        "(Pod, Job, Deployment, StatefulSet, DaemonSet, ReplicaSet, CronJob)"]


@pytest.mark.parametrize("field,value,why", [
    ("apiVersion", deep(900), "apiVersion must be admission.k8s.io/v1, got a list"),
    ("kind", {"a": deep(900)}, "kind must be AdmissionReview, got a mapping"),
    ("apiVersion", "v" * 5000, "apiVersion must be admission.k8s.io/v1, got 'vvvvvvvvvv"),
])
def test_malformed_reviews_describe_what_they_got_without_printing_it_whole(field, value, why):
    with pytest.raises(ReviewError) as e:
        review({**body(), field: value}, rules=RULES, cache_ip=None)
    assert str(e.value).startswith(why) and len(str(e.value)) < 200
