"""AdmissionReview fixtures as kube-apiserver sends them, for Pods and Jobs."""

from __future__ import annotations

import base64
import json
import uuid

import jsonpatch

LABELS = {"app.kubernetes.io/deploy-manager": "ksonnet"}


def pod(*, labels=LABELS, host_aliases=None, annotations=None) -> dict:
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"generateName": "train-", "namespace": "ml", "labels": dict(labels)},
         "spec": {"restartPolicy": "Never",
                  "containers": [{"name": "train", "image": "busybox",
                                  "command": ["wget", "http://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"]}]}}
    if host_aliases is not None:
        p["spec"]["hostAliases"] = host_aliases
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    return p


def job(**kw) -> dict:
    template = pod(**kw)
    meta = {k: v for k, v in template["metadata"].items() if k in ("labels", "annotations")}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"template": {"metadata": meta, "spec": template["spec"]}}}


def review(obj: dict) -> dict:
    group, _, version = obj["apiVersion"].rpartition("/")
    resource = {"Pod": "pods", "Job": "jobs"}[obj["kind"]]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "kind": {"group": group, "version": version, "kind": obj["kind"]},
                        "resource": {"group": group, "version": version, "resource": resource},
                        "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "tester"},
                        "object": obj, "oldObject": None, "dryRun": False}}


def patched(obj: dict, response: dict) -> dict:
    """`obj` after the review response's patch, checking the response envelope on the way."""
    assert response["apiVersion"] == "admission.k8s.io/v1" and response["kind"] == "AdmissionReview"
    resp = response["response"]
    assert resp["allowed"] is True
    if "patch" not in resp:
        return obj
    assert resp["patchType"] == "JSONPatch"
    return jsonpatch.apply_patch(obj, json.loads(base64.b64decode(resp["patch"])))
