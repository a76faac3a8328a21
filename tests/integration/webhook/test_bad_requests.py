"""Malformed requests get a 400 whose one line says what is wrong; never a 500."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from tests.integration.webhook.reviews import pod, review


def without(path: str) -> bytes:
    body = review(pod())
    *parents, last = path.split(".")
    node = body
    for p in parents:
        node = node[p]
    del node[last]
    return json.dumps(body).encode()


def replaced(path: str, value) -> bytes:
    body = review(pod())
    *parents, last = path.split(".")
    node = body
    for p in parents:
        node = node[p]
    node[last] = value
    return json.dumps(body).encode()


@pytest.mark.parametrize("data,message", [
    (b"{not json", "body is not JSON"),
    (b"", "body is not JSON"),
    (b"\xff\xfe", "body is not JSON"),
    (b"[1, 2]", "AdmissionReview must be a JSON object, got list"),
    (replaced("apiVersion", "admission.k8s.io/v1beta1"),
     "apiVersion must be admission.k8s.io/v1, got 'admission.k8s.io/v1beta1'"),
    (replaced("kind", "Pod"), "kind must be AdmissionReview, got 'Pod'"),
    (without("request"), "request is missing"),
    (without("request.uid"), "request.uid must be a non-empty string, got None"),
    (without("request.object"), "request.object is missing"),
    (replaced("request.object", "pod"), "request.object must be an object"),
    (b"[" * 60000, "body nests arrays or objects more than 100 levels deep"),  # under the 64 KiB limit
    (replaced("request.object.metadata.annotations", json.loads("[" * 500 + "]" * 500)),
     "body nests arrays or objects more than 100 levels deep"),
], ids=["not-json", "empty", "not-utf8", "array", "wrong-api-version", "wrong-kind", "no-request", "no-uid",
        "no-object", "object-not-mapping", "nested-beyond-the-parser", "nested-beyond-the-limit"])
async def test_malformed_reviews_get_400_naming_the_problem(webhook, client, data, message):
    async with client.post(f"{webhook.url}/mutate", data=data, headers={"Content-Type": "application/json"}) as r:
        text = await r.text()
    assert r.status == 400
    assert text.startswith(message) and text.count("\n") == 1 and "Traceback" not in text


async def test_an_oversize_body_gets_400_naming_the_limit(webhook, client):
    body = review(pod())
    body["request"]["object"]["metadata"]["annotations"] = {"big": "x" * (64 * 1024)}
    async with client.post(f"{webhook.url}/mutate", json=body) as r:
        assert r.status == 400
        assert "exceeds max_body_bytes (65536)" in await r.text()


async def test_an_oversize_chunked_body_without_length_gets_400_too(webhook, client):
    async def chunks():
        for _ in range(40):
            yield b"x" * 4096

    async with client.post(f"{webhook.url}/mutate", data=chunks()) as r:
        assert r.status == 400
        assert "exceeds max_body_bytes (65536)" in await r.text()


async def test_the_server_keeps_answering_after_bad_requests(webhook, client):
    async with client.post(f"{webhook.url}/mutate", data=b"nope") as r:
        assert r.status == 400
    async with client.post(f"{webhook.url}/mutate", json=review(pod())) as r:
        assert r.status == 200 and (await r.json())["response"]["allowed"] is True


async def test_an_unexpected_error_is_one_line_and_logged_not_a_traceback_page(webhook, client):
    webhook.rules_file.rules = None  # breaks review() inside the handler
    with capture_logs() as logs:
        async with client.post(f"{webhook.url}/mutate", json=review(pod())) as r:
            text = await r.text()
    assert r.status == 500 and text == "internal error: TypeError\n"
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["request_failed"]


@pytest.mark.parametrize("field,value,warning", [
    ("hostAliases", [{"ip": "10.0.0.1", "hostnames": [["x"]]}],
     "nezha: not patched: /spec/hostAliases/0/hostnames/0 is a list, not a hostname"),
    ("hostAliases", [{"ip": {"v4": "10.0.0.1"}, "hostnames": ["x.example"]}],
     "nezha: not patched: /spec/hostAliases/0/ip is a mapping, not an IP address"),
], ids=["hostnames-of-lists", "ip-a-mapping"])
async def test_an_ill_typed_pod_is_allowed_unchanged_with_a_warning_not_a_500(webhook, client, field, value, warning):
    body = review(pod())
    body["request"]["object"]["spec"][field] = value
    async with client.post(f"{webhook.url}/mutate", json=body) as r:
        assert r.status == 200, await r.text()
        answer = (await r.json())["response"]
    assert answer == {"uid": body["request"]["uid"], "allowed": True, "warnings": [warning]}


@pytest.mark.parametrize("levels,status", [(100, 200), (101, 400)])
async def test_nesting_up_to_the_limit_is_reviewed_and_beyond_it_refused(webhook, client, levels, status):
    """AdmissionReview, request, object and metadata are four levels; lists make up the rest."""
    nested = "x"
    for _ in range(levels - 4):
        nested = [nested]
    body = review(pod())
    body["request"]["object"]["metadata"]["x-nested"] = nested
    async with client.post(f"{webhook.url}/mutate", json=body) as r:
        assert r.status == status, await r.text()
