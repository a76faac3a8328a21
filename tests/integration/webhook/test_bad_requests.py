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
], ids=["not-json", "empty", "not-utf8", "array", "wrong-api-version", "wrong-kind", "no-request", "no-uid",
        "no-object", "object-not-mapping"])
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
