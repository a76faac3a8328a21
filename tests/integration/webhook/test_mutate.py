"""POST /mutate over TLS: Pods and Jobs are pointed at the cache, once."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.integration.webhook.reviews import job, patched, pod, review

CACHE = {"ip": "10.106.122.174", "hostnames": ["download.tensorflow.org", "www.cs.toronto.edu"]}
OWN = {"ip": "192.168.0.5", "hostnames": ["registry.local"]}


async def post(client, webhook, body):
    async with client.post(f"{webhook.url}/mutate", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def pod_spec(obj):
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def pod_meta(obj):
    return obj["metadata"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"]


@pytest.mark.parametrize("make", [pod, job], ids=["pod", "job"])
@pytest.mark.parametrize("before,after", [
    (None, [CACHE]),
    ([OWN], [OWN, CACHE]),
    ([{"ip": CACHE["ip"], "hostnames": ["www.cs.toronto.edu"]}],
     [{"ip": CACHE["ip"], "hostnames": ["www.cs.toronto.edu", "download.tensorflow.org"]}]),
], ids=["without-host-aliases", "with-other-host-aliases", "with-same-ip"])
async def test_labelled_objects_get_host_aliases_and_stay_valid(webhook, client, make, before, after):
    obj = make(host_aliases=before)
    result = patched(obj, await post(client, webhook, review(obj)))
    assert pod_spec(result)["hostAliases"] == after
    assert pod_meta(result)["annotations"]["nezha.io/injected"] == "dataset"
    kubernetes_validate.validate(result, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("make", [pod, job], ids=["pod", "job"])
async def test_reinvocation_on_the_patched_object_changes_nothing(webhook, client, make):
    once = patched(make(), await post(client, webhook, review(make())))
    response = await post(client, webhook, review(once))
    assert "patch" not in response["response"] and patched(once, response) == once


async def test_a_pod_that_opts_out_is_left_alone(webhook, client):
    body = review(pod(annotations={"nezha.io/inject": "false"}))
    response = await post(client, webhook, body)
    assert response["response"] == {"uid": body["request"]["uid"], "allowed": True}


async def test_an_unlabelled_pod_is_allowed_without_a_patch(webhook, client):
    body = review(pod(labels={"app": "web"}))
    response = await post(client, webhook, body)
    assert response["response"] == {"uid": body["request"]["uid"], "allowed": True}


async def test_an_object_that_cannot_be_patched_is_allowed_with_a_warning(webhook, client):
    body = review(pod())
    body["request"]["object"]["spec"] = ["not", "a", "spec"]
    response = await post(client, webhook, body)
    assert response["response"]["allowed"] is True and "patch" not in response["response"]
    assert "no pod spec" in response["response"]["warnings"][0]


async def test_healthz_answers_on_the_tls_port(webhook, client):
    async with client.get(f"{webhook.url}/healthz") as r:
        assert r.status == 200
        assert (await r.json())["rules"] == ["dataset"]
