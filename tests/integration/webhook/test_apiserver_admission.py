"""The API double calls the webhook over TLS as kube-apiserver does, and stores the mutated pod."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from dataclasses import replace

import pytest
import trustme
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from testkit.ports import free_port
from tests.integration.webhook.registration import configuration, namespace, register
from tests.integration.webhook.reviews import job, pod

CACHE = {"ip": "10.106.122.174", "hostnames": ["download.tensorflow.org", "www.cs.toronto.edu"]}


async def test_a_labelled_pod_is_stored_with_host_aliases(kube, kube_api, webhook, tls):
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"{webhook.url}/mutate")
    stored = await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    assert [a.to_dict() for a in stored.spec.host_aliases] == [CACHE]
    assert stored.metadata.annotations["nezha.io/injected"] == "dataset"
    assert stored.metadata.name.startswith("train-")
    [call] = kube_api.admission_calls
    assert call.outcome == "patched" and call.review["request"]["namespace"] == "ml"


async def test_a_job_template_is_patched_and_its_pod_ends_with_exactly_one_set_of_aliases(kube, kube_api, webhook,
                                                                                         tls):
    """Template, then pod: the pod's own review finds the aliases there already and adds nothing."""
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"{webhook.url}/mutate")
    created = await client.BatchV1Api(kube).create_namespaced_job("ml", job())
    assert [a.to_dict() for a in created.spec.template.spec.host_aliases] == [CACHE]
    assert created.spec.template.metadata.annotations == {"nezha.io/injected": "dataset"}
    core = client.CoreV1Api(kube)
    for _ in range(100):
        pods = (await core.list_namespaced_pod("ml", label_selector="job-name=train")).items
        if pods:
            break
        await asyncio.sleep(0.02)
    [stored] = pods
    assert [a.to_dict() for a in stored.spec.host_aliases] == [CACHE]
    assert stored.metadata.annotations == {"nezha.io/injected": "dataset"}
    assert stored.metadata.owner_references[0].kind == "Job" and kube_api.job_errors == []
    assert [(c.review["request"]["kind"]["kind"], c.outcome) for c in kube_api.admission_calls] == [
        ("Job", "patched"), ("Pod", "unchanged")]


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet"])
async def test_deployment_and_statefulset_templates_are_patched(kube, kube_api, webhook, tls, kind):
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"{webhook.url}/mutate")
    template = job()["spec"]["template"]
    template["metadata"]["labels"]["app"] = "train"
    template["spec"]["restartPolicy"] = "Always"
    spec = {"replicas": 1, "selector": {"matchLabels": {"app": "train"}}, "template": template}
    apps = client.AppsV1Api(kube)
    if kind == "Deployment":
        created = await apps.create_namespaced_deployment("ml", {"metadata": {"name": "train"}, "spec": spec})
    else:
        created = await apps.create_namespaced_stateful_set("ml", {"metadata": {"name": "train"},
                                                                   "spec": {**spec, "serviceName": "train"}})
    assert [a.to_dict() for a in created.spec.template.spec.host_aliases] == [CACHE]
    assert [(c.review["request"]["kind"]["kind"], c.outcome) for c in kube_api.admission_calls] == [
        (kind, "patched")]


async def test_the_service_reference_is_verified_against_the_service_dns_name(kube, kube_api, webhook, tls):
    await namespace(kube, "ml")
    kube_api.service_addresses[("nezha", "nezha-webhook", 443)] = f"127.0.0.1:{webhook.settings.listen_addr[1]}"
    await register(kube, ca_pem=tls.ca.cert_pem.bytes())
    stored = await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    assert stored.spec.host_aliases[0].ip == CACHE["ip"]


@pytest.mark.parametrize("ns,selector,called", [
    ("kube-system", None, False),
    ("nezha", None, False),
    ("ml", None, True),
    ("ml", {"namespaceSelector": {"matchLabels": {"nezha.io/inject": "enabled"}}}, False),
    ("ml", {"objectSelector": {"matchLabels": {"team": "vision"}}}, False),
    ("ml", {"objectSelector": {"matchLabels": {"app.kubernetes.io/deploy-manager": "ksonnet"}}}, True),
])
async def test_namespace_and_object_selectors_decide_who_is_sent(kube, kube_api, webhook, tls, ns, selector,
                                                                called):
    if ns != "kube-system":
        await namespace(kube, ns)
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"{webhook.url}/mutate", **(selector or {}))
    obj = pod()
    obj["metadata"]["namespace"] = ns
    stored = await client.CoreV1Api(kube).create_namespaced_pod(ns, obj)
    assert bool(kube_api.admission_calls) is called
    assert (stored.spec.host_aliases is not None) is called


async def test_an_unreachable_webhook_fails_open_under_ignore(kube, kube_api, tls):
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"https://127.0.0.1:{free_port()}/mutate")
    stored = await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    assert stored.spec.host_aliases is None
    assert [c.outcome for c in kube_api.admission_calls] == ["failed-open"]


async def test_a_failing_webhook_under_fail_refuses_the_pod_with_internal_error(kube, kube_api, tls):
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"https://127.0.0.1:{free_port()}/mutate",
                   failurePolicy="Fail")
    with pytest.raises(ApiException) as e:
        await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    assert e.value.status == 500 and 'failed calling webhook \\"pods.webhook.nezha.io\\"' in e.value.body
    assert (await client.CoreV1Api(kube).list_namespaced_pod("ml")).items == []


async def test_a_ca_bundle_of_another_ca_fails_the_tls_handshake(kube, kube_api, webhook):
    await namespace(kube, "ml")
    await register(kube, ca_pem=trustme.CA().cert_pem.bytes(), url=f"{webhook.url}/mutate", failurePolicy="Fail")
    with pytest.raises(ApiException) as e:
        await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    assert e.value.status == 500 and "CERTIFICATE_VERIFY_FAILED" in e.value.body


@pytest.fixture
async def slow_webhook(tls):
    """A TLS webhook that answers after 3 s, longer than the timeout under test."""
    async def handler(request):
        await asyncio.sleep(3)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/mutate", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.cert, tls.key)
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
    yield f"https://127.0.0.1:{port}/mutate"
    await runner.cleanup()


async def test_a_slow_webhook_is_cut_at_timeout_seconds_and_the_pod_admitted(kube, kube_api, tls, slow_webhook):
    """The call's one timer is the hook's timeoutSeconds (1 s): its deadline fired (the webhook's late
    answer would have failed otherwise, as no AdmissionReview), after at least 1 s."""
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=slow_webhook, timeoutSeconds=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    stored = await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    assert loop.time() - started > 0.9
    assert stored.spec.host_aliases is None
    [call] = kube_api.admission_calls
    assert call.outcome == "failed-open" and call.error == "context deadline exceeded"
    assert call.deadline == 1


async def test_the_webhooks_warnings_reach_the_client(kube, kube_api, webhook, tls):
    await namespace(kube, "ml")
    webhook.cache_ip = None
    webhook.rules_file.rules = tuple(replace(r, host_aliases=tuple(replace(a, ip=None) for a in r.host_aliases))
                                     for r in webhook.rules_file.rules)
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"{webhook.url}/mutate")
    core = client.CoreV1Api(kube)
    _, code, headers = await core.create_namespaced_pod_with_http_info("ml", pod())
    assert code == 201 and "cache Service IP is not known" in headers["Warning"]


@pytest.fixture
async def sidecar_webhook(tls):
    """Another mutating webhook that adds a sidecar container, as service meshes do."""
    async def handler(request):
        req = (await request.json())["request"]
        ops = [{"op": "add", "path": "/spec/containers/-", "value": {"name": "sidecar", "image": "envoy"}}]
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
            "uid": req["uid"], "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(ops).encode()).decode()}})

    app = web.Application()
    app.router.add_post("/mutate", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.cert, tls.key)
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
    yield f"https://127.0.0.1:{port}/mutate"
    await runner.cleanup()


async def test_a_later_webhook_change_reinvokes_nezha_which_changes_nothing(kube, kube_api, webhook, tls,
                                                                          sidecar_webhook):
    await namespace(kube, "ml")
    await register(kube, ca_pem=tls.ca.cert_pem.bytes(), url=f"{webhook.url}/mutate")
    sidecar = configuration(ca_pem=tls.ca.cert_pem.bytes(), url=sidecar_webhook, name="sidecar.example.com",
                            reinvocationPolicy="Never")
    sidecar["metadata"]["name"] = "zz-sidecar"  # configurations run in name order: after nezha's
    await client.AdmissionregistrationV1Api(kube).create_mutating_webhook_configuration(sidecar)
    stored = await client.CoreV1Api(kube).create_namespaced_pod("ml", pod())
    assert [(c.webhook, c.outcome) for c in kube_api.admission_calls] == [
        ("pods.webhook.nezha.io", "patched"), ("sidecar.example.com", "patched"),
        ("pods.webhook.nezha.io", "unchanged")]
    assert [c.name for c in stored.spec.containers] == ["train", "sidecar"]
    assert [a.to_dict() for a in stored.spec.host_aliases] == [CACHE]
