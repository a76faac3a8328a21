"""The API double, driven by the real kubernetes_asyncio client exactly as Nezha drives a cluster."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import uuid

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch


def configmap(name, data=None, labels=None):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels or {}},
            "data": data or {}}


async def test_objects_are_created_read_listed_and_deleted_with_resource_versions(kube, ns):
    core = client.CoreV1Api(kube)
    created = await core.create_namespaced_config_map(ns, configmap("a", {"k": "v"}, {"team": "ml"}))
    await core.create_namespaced_config_map(ns, configmap("b", labels={"team": "web"}))
    assert created.metadata.uid and int(created.metadata.resource_version) > 0
    got = await core.read_namespaced_config_map("a", ns)
    assert got.data == {"k": "v"} and got.metadata.resource_version == created.metadata.resource_version
    listed = await core.list_namespaced_config_map(ns, label_selector="team=ml")
    assert [c.metadata.name for c in listed.items] == ["a"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    await core.delete_namespaced_config_map("a", ns)
    assert [c.metadata.name for c in (await core.list_namespaced_config_map(ns)).items] == ["b"]


async def test_missing_and_duplicate_objects_get_status_objects(kube, ns):
    core = client.CoreV1Api(kube)
    with pytest.raises(ApiException) as e:
        await core.read_namespaced_config_map("nope", ns)
    assert e.value.status == 404 and '"reason":"NotFound"' in e.value.body.replace(" ", "")
    await core.create_namespaced_config_map(ns, configmap("a"))
    with pytest.raises(ApiException) as e:
        await core.create_namespaced_config_map(ns, configmap("a"))
    assert e.value.status == 409 and "AlreadyExists" in e.value.body
    with pytest.raises(ApiException) as e:
        await core.create_namespaced_config_map("missing-ns", configmap("a"))
    assert e.value.status == 404 and 'namespaces \\"missing-ns\\" not found' in e.value.body


async def test_a_stale_replace_conflicts_and_a_fresh_one_succeeds(kube, ns):
    core = client.CoreV1Api(kube)
    cm = await core.create_namespaced_config_map(ns, configmap("a", {"v": "1"}))
    cm.data = {"v": "2"}
    updated = await core.replace_namespaced_config_map("a", ns, cm)
    cm.data = {"v": "3"}
    with pytest.raises(ApiException) as e:
        await core.replace_namespaced_config_map("a", ns, cm)  # carries the old resourceVersion
    assert e.value.status == 409 and "Conflict" in e.value.body
    assert updated.data == {"v": "2"}


async def test_merge_strategic_and_json_patches_apply(kube, ns):
    core = client.CoreV1Api(kube)
    await core.create_namespaced_config_map(ns, configmap("a", {"x": "1", "y": "2"}))
    merged = await core.patch_namespaced_config_map("a", ns, {"data": {"x": None, "z": "3"}},
                                                    _content_type="application/merge-patch+json")
    assert merged.data == {"y": "2", "z": "3"}
    strategic = await core.patch_namespaced_config_map("a", ns, {"metadata": {"annotations": {"a": "b"}}})
    assert strategic.metadata.annotations == {"a": "b"} and strategic.data == {"y": "2", "z": "3"}
    patched = await core.patch_namespaced_config_map("a", ns, [{"op": "replace", "path": "/data/y",
                                                                        "value": "9"}])
    assert patched.data == {"y": "9", "z": "3"}


async def test_strategic_merge_merges_named_lists_by_name(kube, ns):
    apps = client.AppsV1Api(kube)
    await apps.create_namespaced_stateful_set(ns, statefulset("cache"))
    patched = await apps.patch_namespaced_stateful_set("cache", ns, {"spec": {"template": {"spec": {
        "containers": [{"name": "cache", "env": [{"name": "A", "value": "1"}]}]}}}})
    [container] = patched.spec.template.spec.containers
    assert container.image == "nezha" and container.env[0].name == "A"


def statefulset(name, replicas=2):
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "serviceName": f"{name}-peers", "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "cache", "image": "nezha"}]}}}}


async def test_the_scale_subresource_reads_and_sets_replicas(kube, ns):
    apps = client.AppsV1Api(kube)
    await apps.create_namespaced_stateful_set(ns, statefulset("cache", 2))
    scale = await apps.read_namespaced_stateful_set_scale("cache", ns)
    assert scale.spec.replicas == 2 and scale.status.selector == "app=cache"
    await apps.patch_namespaced_stateful_set_scale("cache", ns, {"spec": {"replicas": 5}})
    sts = await apps.read_namespaced_stateful_set("cache", ns)
    assert sts.spec.replicas == 5 and sts.metadata.generation == 2
    with pytest.raises(ApiException) as e:
        await apps.patch_namespaced_stateful_set_scale("cache", ns, {"spec": {"replicas": -1}})
    assert e.value.status == 422


async def test_services_get_a_cluster_ip(kube, ns):
    core = client.CoreV1Api(kube)
    svc = await core.create_namespaced_service(ns, {"metadata": {"name": "nezha-cache"},
                                                           "spec": {"ports": [{"port": 80}]}})
    assert ipaddress.ip_address(svc.spec.cluster_ip)


async def next_event(stream, timeout=5.0):
    return await asyncio.wait_for(stream.__anext__(), timeout)


async def test_a_watch_starts_with_current_objects_then_streams_changes_in_order(kube, ns):
    core = client.CoreV1Api(kube)
    await core.create_namespaced_config_map(ns, configmap("a"))
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns)
    try:
        first = await next_event(stream)
        assert (first["type"], first["object"].metadata.name) == ("ADDED", "a")
        await core.patch_namespaced_config_map("a", ns, {"data": {"k": "v"}})
        await core.delete_namespaced_config_map("a", ns)
        modified, deleted = await next_event(stream), await next_event(stream)
        assert modified["type"] == "MODIFIED" and modified["object"].data == {"k": "v"}
        assert deleted["type"] == "DELETED"
        assert int(deleted["object"].metadata.resource_version) > int(modified["object"].metadata.resource_version)
    finally:
        await w.close()


async def test_a_watch_from_a_resource_version_replays_only_later_events(kube, ns):
    core = client.CoreV1Api(kube)
    await core.create_namespaced_config_map(ns, configmap("old"))
    listed = await core.list_namespaced_config_map(ns)
    await core.create_namespaced_config_map(ns, configmap("new"))
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns, resource_version=listed.metadata.resource_version)
    try:
        event = await next_event(stream)
        assert (event["type"], event["object"].metadata.name) == ("ADDED", "new")
    finally:
        await w.close()


async def test_bookmarks_carry_the_current_resource_version(kube_api, kube, ns):
    """The double sends them every 0.2 s here; kube-apiserver about once a minute, so double only."""
    core = client.CoreV1Api(kube)
    await core.create_namespaced_config_map(ns, configmap("a"))
    listed = await core.list_namespaced_config_map(ns)
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns, resource_version=listed.metadata.resource_version,
                      allow_watch_bookmarks=True)
    try:
        event = await next_event(stream)
        assert event["type"] == "BOOKMARK"
        assert event["raw_object"]["metadata"]["resourceVersion"] == listed.metadata.resource_version
        assert w.resource_version == listed.metadata.resource_version
    finally:
        await w.close()


async def test_a_watch_from_a_compacted_version_gets_410_gone(kube_api, kube, ns):
    core = client.CoreV1Api(kube)
    await core.create_namespaced_config_map(ns, configmap("a"))
    old = (await core.list_namespaced_config_map(ns)).metadata.resource_version
    await core.create_namespaced_config_map(ns, configmap("b"))
    kube_api.compact()
    w = Watch()
    with pytest.raises(ApiException) as e:
        async for _ in w.stream(core.list_namespaced_config_map, ns, resource_version=old):
            pass
    assert e.value.status == 410 and "Expired" in e.value.reason


async def test_a_watch_with_timeout_seconds_ends_at_its_deadline(kube_api, kube, ns):
    """Ended cleanly by the double's timeoutSeconds deadline (what `watch_ends` records), not before it;
    how soon after it a loaded machine runs the end is no property of the double."""
    core = client.CoreV1Api(kube)
    w = Watch()
    started = asyncio.get_running_loop().time()
    events = [e async for e in w.stream(core.list_namespaced_config_map, ns, timeout_seconds=1)]
    assert events == [] and asyncio.get_running_loop().time() - started > 0.9
    assert kube_api.watch_ends == ["timeoutSeconds"]


async def test_a_dropped_watch_resumes_from_the_last_version_without_losing_events(kube_api, kube, ns):
    core = client.CoreV1Api(kube)
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns)
    try:
        await core.create_namespaced_config_map(ns, configmap("a"))
        assert (await next_event(stream))["object"].metadata.name == "a"
        assert kube_api.drop_watches(abrupt=False) == 1
        await core.create_namespaced_config_map(ns, configmap("b"))
        event = await next_event(stream)  # the client reconnects from resource_version
        assert (event["type"], event["object"].metadata.name) == ("ADDED", "b")
    finally:
        await w.close()


async def test_an_abruptly_cut_watch_raises_in_the_client(kube_api, kube, ns):
    core = client.CoreV1Api(kube)
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns)
    await core.create_namespaced_config_map(ns, configmap("a"))
    await next_event(stream)
    kube_api.drop_watches(abrupt=True)
    with pytest.raises(Exception) as e:
        await next_event(stream)
    assert not isinstance(e.value, asyncio.TimeoutError)


async def test_a_stalled_watch_sends_nothing_not_even_its_end_until_the_client_gives_up(kube_api, kube, ns):
    """What a half-open connection looks like from the client: timeoutSeconds passes and nothing comes,
    until the client's own deadline (`_request_timeout`) ends the wait, not the test's guard."""
    core = client.CoreV1Api(kube)
    await core.create_namespaced_config_map(ns, configmap("a"))
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns, timeout_seconds=1, allow_watch_bookmarks=True,
                      _request_timeout=2.5)
    assert (await next_event(stream))["object"].metadata.name == "a"
    assert kube_api.stall_watches() == 1
    await core.create_namespaced_config_map(ns, configmap("b"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.ensure_future(stream.__anext__())
    await asyncio.wait({waiting}, timeout=60)  # a guard against a hang only: it cancels nothing
    assert waiting.done(), "the client's own deadline never ended the wait"
    assert isinstance(waiting.exception(), asyncio.TimeoutError), waiting.exception()  # not the stream's end
    assert loop.time() - started > 1.5, "it outlived timeoutSeconds: the double sent no end"
    while kube_api.watchers and loop.time() - started < 60:  # the double notices the client left (a hang guard)
        await asyncio.sleep(0.05)
    assert not kube_api.watchers
    assert kube_api.watch_ends == ["client gone"], "let go when the client left, not at timeoutSeconds"
    fresh = Watch()
    try:  # later watches are not stalled
        event = await next_event(fresh.stream(core.list_namespaced_config_map, ns))
        assert event["type"] == "ADDED"
    finally:
        await fresh.close()


async def test_a_watch_from_before_the_kept_history_gets_410_gone_not_a_replay_with_a_gap(kube_api, kube, ns):
    """Like etcd after compaction: history keeps the last `history_limit` events, older versions are gone."""
    kube_api.history_limit = 3
    core = client.CoreV1Api(kube)
    created = {n: await core.create_namespaced_config_map(ns, configmap(n)) for n in "abcdef"}
    version = {n: cm.metadata.resource_version for n, cm in created.items()}
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns, resource_version=version["b"], timeout_seconds=5)
    with pytest.raises(ApiException) as e:  # c's event was dropped: replaying d, e, f would skip it
        await next_event(stream)
    assert e.value.status == 410 and "Expired" in e.value.reason
    w = Watch()
    stream = w.stream(core.list_namespaced_config_map, ns, resource_version=version["c"], timeout_seconds=5)
    try:
        replayed = [await next_event(stream) for _ in range(3)]
    finally:
        await w.close()
    assert [(e["type"], e["object"].metadata.name) for e in replayed] == [("ADDED", "d"), ("ADDED", "e"),
                                                                         ("ADDED", "f")]


def webhook_configuration(name, **hook):
    body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{"name": "pods.test.nezha.io", "clientConfig": {"url": "https://127.0.0.1:9/mutate"},
                          "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                     "resources": ["pods"]}],
                          "sideEffects": "None", "admissionReviewVersions": ["v1"]}]}
    for key, value in hook.items():
        if value is None:
            del body["webhooks"][0][key]
        else:
            body["webhooks"][0][key] = value
    return body


@pytest.mark.parametrize("hook,errors", [
    ({"sideEffects": None}, ["webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun"]),
    ({"admissionReviewVersions": None},
     ["webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1"]),
    ({"sideEffects": None, "admissionReviewVersions": None},
     ["webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun",
      "webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1"]),
    ({"sideEffects": "Some"}, ['webhooks[0].sideEffects: Unsupported value: "Some"']),
], ids=["no-side-effects", "no-review-versions", "neither", "side-effects-some"])
async def test_a_webhook_configuration_without_side_effects_or_review_versions_is_invalid(kube, hook, errors):
    """admissionregistration.k8s.io/v1 defaults neither; kube-apiserver answers 422 listing each field."""
    api = client.AdmissionregistrationV1Api(kube)
    name = f"nezha-test-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(ApiException) as e:
            await api.create_mutating_webhook_configuration(webhook_configuration(name, **hook))
    finally:
        with contextlib.suppress(ApiException):  # only if it was wrongly accepted
            await api.delete_mutating_webhook_configuration(name)
    status = json.loads(e.value.body)
    assert e.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith(f'MutatingWebhookConfiguration.admissionregistration.k8s.io "{name}" is '
                                        "invalid: ")
    for error in errors:
        assert error in status["message"]
    assert [c["field"] for c in status["details"]["causes"]] == [error.split(":")[0] for error in errors]


async def test_a_complete_webhook_configuration_is_stored_and_an_update_is_validated_too(kube):
    api = client.AdmissionregistrationV1Api(kube)
    name = f"nezha-test-{uuid.uuid4().hex[:8]}"
    created = await api.create_mutating_webhook_configuration(webhook_configuration(name))
    try:
        assert created.webhooks[0].side_effects == "None"
        with pytest.raises(ApiException) as e:
            await api.patch_mutating_webhook_configuration(name, [{"op": "remove",
                                                                   "path": "/webhooks/0/admissionReviewVersions"}])
        assert e.value.status == 422 and "admissionReviewVersions: Required value" in e.value.body
    finally:
        await api.delete_mutating_webhook_configuration(name)


async def test_a_bound_pod_is_deleted_gracefully_and_removed_by_the_kubelets_zero_grace_delete(kube, ns):
    """kube-apiserver: deletionTimestamp and deletionGracePeriodSeconds first (MODIFIED), gone at grace 0."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    core = client.CoreV1Api(kube)
    spec = {"nodeName": "node-a", "terminationGracePeriodSeconds": 45,
            "containers": [{"name": "c", "image": "busybox"}]}
    await core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
    await core.delete_namespaced_pod("p", ns)
    terminating = await core.read_namespaced_pod("p", ns)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 45
    await core.delete_namespaced_pod("p", ns, grace_period_seconds=0)
    try:
        await core.read_namespaced_pod("p", ns)
    except ApiException as e:
        assert e.status == 404
    else:
        raise AssertionError("the pod is still there after a zero-grace delete")


async def test_a_gated_pod_stays_pending_and_its_gates_can_be_removed_but_never_added(kube, ns):
    """kube-apiserver: schedulingGates are set at creation (PodScheduled=False, SchedulingGated), then only
    removed; an added gate is refused naming it."""
    core = client.CoreV1Api(kube)
    spec = {"schedulingGates": [{"name": "example.com/a"}, {"name": "example.com/b"}],
            "containers": [{"name": "c", "image": "busybox"}]}
    created = await core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "g"},
                                                    "spec": spec})
    assert created.status.phase == "Pending"
    [scheduled] = [c for c in created.status.conditions if c.type == "PodScheduled"]
    assert (scheduled.status, scheduled.reason) == ("False", "SchedulingGated")
    with pytest.raises(ApiException) as e:
        await core.patch_namespaced_pod("g", ns, [{"op": "add", "path": "/spec/schedulingGates/-",
                                                   "value": {"name": "example.com/c"}}],
                                        _content_type="application/json-patch+json")
    assert e.value.status == 422
    assert ("spec.schedulingGates[2].name: Forbidden: only deletion is allowed, but found new scheduling gate "
            "'example.com/c'") in json.loads(e.value.body)["message"]
    await core.patch_namespaced_pod("g", ns, [{"op": "remove", "path": "/spec/schedulingGates/1"}],
                                    _content_type="application/json-patch+json")
    await core.patch_namespaced_pod("g", ns, [{"op": "remove", "path": "/spec/schedulingGates/0"}],
                                    _content_type="application/json-patch+json")
    assert not (await core.read_namespaced_pod("g", ns)).spec.scheduling_gates


async def test_discovery_lists_groups_resources_and_the_scale_subresource(kube):
    """What kubectl maps kinds with; checked with the real client's discovery calls."""
    groups = await client.ApisApi(kube).get_api_versions()
    assert {"apps", "batch", "rbac.authorization.k8s.io", "coordination.k8s.io"} <= {g.name for g in groups.groups}
    apps = await client.AppsV1Api(kube).get_api_resources()
    by_name = {r.name: r for r in apps.resources}
    assert by_name["statefulsets"].kind == "StatefulSet" and by_name["statefulsets"].namespaced
    assert by_name["statefulsets/scale"].group == "autoscaling" and by_name["statefulsets/scale"].kind == "Scale"
    core = await client.CoreV1Api(kube).get_api_resources()
    assert {"pods", "services", "secrets", "serviceaccounts"} <= {r.name for r in core.resources}
    versions = await client.CoreApi(kube).get_api_versions()
    assert "v1" in versions.versions


async def test_a_custom_resource_is_served_and_discovered_only_once_its_crd_is_installed(kube_api, kube, ns):
    """As kube-apiserver: an unknown group is absent from discovery and its paths are 404; once the CRD is
    established both serve it, and a strategic merge patch of a custom resource is refused (415)."""
    from testkit.kubeapi.resources import LEADER_WORKER_SETS as LWS

    custom = client.CustomObjectsApi(kube)
    assert LWS.group not in {g.name for g in (await client.ApisApi(kube).get_api_versions()).groups}
    with pytest.raises(ApiException) as e:
        await custom.list_namespaced_custom_object(LWS.group, LWS.version, ns, LWS.plural)
    assert e.value.status == 404

    kube_api.install_crd(LWS)
    groups = {g.name: g for g in (await client.ApisApi(kube).get_api_versions()).groups}
    assert groups[LWS.group].preferred_version.version == "v1"
    body = {"apiVersion": LWS.api_version, "kind": LWS.kind, "metadata": {"name": "llm"},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2}}}
    await custom.create_namespaced_custom_object(LWS.group, LWS.version, ns, LWS.plural, body)
    listed = await custom.list_namespaced_custom_object(LWS.group, LWS.version, ns, LWS.plural)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["llm"]
    patch = {"metadata": {"annotations": {"a": "b"}}}
    with pytest.raises(ApiException) as e:
        await custom.patch_namespaced_custom_object(LWS.group, LWS.version, ns, LWS.plural, "llm", patch,
                                                    _content_type="application/strategic-merge-patch+json")
    assert e.value.status == 415
    merged = await custom.patch_namespaced_custom_object(LWS.group, LWS.version, ns, LWS.plural, "llm", patch,
                                                         _content_type="application/merge-patch+json")
    assert merged["metadata"]["annotations"] == {"a": "b"} and merged["spec"]["replicas"] == 1
