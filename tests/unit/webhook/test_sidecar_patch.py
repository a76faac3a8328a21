"""webhook.patch with webhook.sidecar: the sidecar deployment model from a rule and annotations."""

from __future__ import annotations

import copy

import jsonpatch
import kubernetes_validate
import pytest

from webhook import sidecar as sc
from webhook.patch import INJECTED, patch_for
from webhook.rules import RuleError, parse_rules
from webhook.review import review

KEY = "nezha.io/cache"
HOSTS = ["www.cs.toronto.edu", "yann.lecun.com"]
CONFIG = sc.SidecarConfig(image="registry.example/nezha:0.2.0", parent="http://nezha-cache.nezha.svc:80",
                          size="20Gi", resources={"requests": {"cpu": "100m", "memory": "128Mi"},
                                                  "limits": {"memory": "512Mi"}},
                          origins={"www.cs.toronto.edu": "http://127.0.0.1:9999"}, server_version=(1, 35))


def rules(deployment: str | None = "sidecar", mode: str = "hosts", tls: bool = False):
    extra = f"\n  deployment: {deployment}" if deployment else ""
    return parse_rules(f"""
- name: datasets
  app: {KEY}
  label: "true"
  mode: {mode}
  tls: {str(tls).lower()}{extra}
  hostAliases:
    - hostnames: [{', '.join(HOSTS)}]
""")


def pod(*, annotations=None, spec_extra=None):
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "train", "namespace": "ml", "labels": {KEY: "true"}},
         "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": "busybox",
                                                            "command": ["wget", "http://www.cs.toronto.edu/x"]}]}}
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    p["spec"].update(spec_extra or {})
    return p


def apply(obj, *, rule_set=None, config=CONFIG, kind="Pod", cache_ip="10.96.0.9"):
    result = patch_for(obj=obj, kind=kind, namespace="ml", rules=rule_set or rules(), cache_ip=cache_ip,
                       proxy_url="http://nezha-cache.nezha.svc:80", sidecar=config)
    patched = jsonpatch.apply_patch(obj, result.ops) if result.ops else copy.deepcopy(obj)
    return result, patched


def validate(obj):
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def the_sidecar(patched):
    (side,) = [c for c in patched["spec"]["initContainers"] if c["name"] == sc.CONTAINER]
    return side


def test_a_sidecar_rule_gives_the_pod_a_native_sidecar_that_serves_the_rules_hosts_from_its_loopback():
    result, patched = apply(pod())
    validate(patched)
    side = the_sidecar(patched)
    assert side["restartPolicy"] == "Always"
    assert side["image"] == CONFIG.image
    args = side["args"]
    assert args[0] == "cache"
    assert "--listen=127.0.0.1:80" in args and "--tls-listen=127.0.0.1:443" in args
    assert "--parent=http://nezha-cache.nezha.svc:80" in args
    # The chart's upstream where it names one; the host itself where it does not.
    assert [a for a in args if a.startswith("--origin=")] == [
        "--origin=www.cs.toronto.edu=http://127.0.0.1:9999", "--origin=yann.lecun.com=http://yann.lecun.com"]
    assert side["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    assert patched["spec"]["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": HOSTS}]
    assert result.status == "sidecar" and result.fallback is None
    assert patched["metadata"]["annotations"] == {INJECTED: "datasets", sc.STATUS_ANNOTATION: "sidecar",
                                                  sc.HOSTS_ANNOTATION: sc.HOSTS_FILE}
    # The training container is left as it was.
    assert patched["spec"]["containers"] == pod()["spec"]["containers"]


def test_the_data_volume_has_the_default_size_limit_and_the_capacity_leaves_headroom_below_it():
    _, patched = apply(pod())
    assert {"name": sc.VOLUME, "emptyDir": {"sizeLimit": "20Gi"}} in patched["spec"]["volumes"]
    side = the_sidecar(patched)
    capacity = int(next(a for a in side["args"] if a.startswith("--capacity=")).split("=", 1)[1])
    assert capacity == 20 * 1024 ** 3 - 2 * 1024 ** 3  # 10 % of 20Gi
    assert {m["mountPath"] for m in side["volumeMounts"] if m["name"] == sc.VOLUME} == {"/var/lib/nezha", "/tmp"}
    assert "--data-dir=/var/lib/nezha" in side["args"]


def test_a_sidecar_without_a_cpu_limit_runs_one_worker_not_one_per_cpu_of_its_node():
    """`--workers auto` would see a GPU node's 96 to 192 CPUs: the sidecar says how many."""
    _, patched = apply(pod())
    assert [a for a in the_sidecar(patched)["args"] if a.startswith("--workers")] == ["--workers=1"]


@pytest.mark.parametrize("cpu, workers", [("2", 2), ("1500m", 2), ("2000m", 2), ("250m", 1), ("0.5", 1), ("3.2", 4)])
def test_a_sidecar_with_a_cpu_limit_runs_that_many_workers_rounded_up(cpu, workers):
    config = sc.SidecarConfig(image=CONFIG.image, parent=CONFIG.parent, server_version=(1, 35),
                              resources={"limits": {"cpu": cpu, "memory": "1Gi"}})
    _, patched = apply(pod(), config=config)
    assert [a for a in the_sidecar(patched)["args"] if a.startswith("--workers")] == [f"--workers={workers}"]


@pytest.mark.parametrize("size,capacity", [
    (1024 ** 3, 1024 ** 3 - 256 * 1024 ** 2),  # small volumes keep the fixed minimum headroom
    (100 * 1024 ** 3, 90 * 1024 ** 3),
])
def test_capacity_is_below_the_volume_by_a_tenth_and_at_least_256_mib(size, capacity):
    assert sc.capacity_for(size) == capacity


def test_the_size_annotation_sets_the_volume_size_and_the_capacity():
    _, patched = apply(pod(annotations={sc.SIZE_ANNOTATION: "50Gi"}))
    assert {"name": sc.VOLUME, "emptyDir": {"sizeLimit": "50Gi"}} in patched["spec"]["volumes"]
    assert f"--capacity={45 * 1024 ** 3}" in the_sidecar(patched)["args"]


@pytest.mark.parametrize("value", ["lots", "10GB", "-1Gi", "512Mi"])
def test_an_invalid_size_annotation_is_named_in_a_warning_and_the_default_is_used(value):
    result, patched = apply(pod(annotations={sc.SIZE_ANNOTATION: value}))
    assert any(sc.SIZE_ANNOTATION in w and repr(value) in w for w in result.warnings), result.warnings
    assert {"name": sc.VOLUME, "emptyDir": {"sizeLimit": "20Gi"}} in patched["spec"]["volumes"]


def test_the_sidecar_has_an_etc_hosts_of_its_own_so_it_resolves_the_origins_past_the_pods_aliases():
    """The kubelet leaves /etc/hosts alone in a container that mounts one; the sidecar's comes from a pod
    annotation through a downwardAPI volume and maps localhost only."""
    _, patched = apply(pod())
    (mount,) = [m for m in the_sidecar(patched)["volumeMounts"] if m["mountPath"] == "/etc/hosts"]
    (volume,) = [v for v in patched["spec"]["volumes"] if v["name"] == mount["name"]]
    (item,) = volume["downwardAPI"]["items"]
    assert item["path"] == mount["subPath"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{sc.HOSTS_ANNOTATION}']"
    hosts = patched["metadata"]["annotations"][sc.HOSTS_ANNOTATION]
    assert {line.split()[0] for line in hosts.splitlines()} == {"127.0.0.1", "::1"}
    assert not any(h in hosts for h in HOSTS)
    assert "volumeMounts" not in patched["spec"]["containers"][0]  # the training container keeps the pod's


def test_the_sidecar_starts_only_once_its_startup_probe_reads_readyz_on_its_loopback():
    probe = the_sidecar(apply(pod())[1])["startupProbe"]
    command = probe["exec"]["command"]
    assert command[:2] == ["python", "-c"] and "http://127.0.0.1:80/readyz" in command[2]
    assert probe["periodSeconds"] == 1 and probe["failureThreshold"] >= 60


def test_the_sidecar_runs_with_least_privilege_and_the_pod_may_bind_low_ports_by_sysctl():
    _, patched = apply(pod())
    security = the_sidecar(patched)["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}  # nothing added: see webhook/sidecar.py
    assert patched["spec"]["securityContext"] == {"sysctls": [{"name": sc.SYSCTL, "value": "0"}]}


def test_a_second_admission_of_the_patched_pod_adds_nothing():
    _, patched = apply(pod())
    again, _ = apply(patched)
    assert again.ops == [] and again.warnings == []


def test_a_pod_made_from_a_patched_job_template_gets_nothing_twice():
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
           "spec": {"template": {"metadata": {"labels": {KEY: "true"}}, "spec": pod()["spec"]}}}
    _, patched_job = apply(job, kind="Job")
    validate(patched_job)
    from_template = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {**patched_job["spec"]["template"]["metadata"], "name": "train-x", "namespace": "ml"},
                     "spec": patched_job["spec"]["template"]["spec"]}
    again, _ = apply(from_template)
    assert again.ops == []


def test_the_sidecar_is_merged_with_what_the_pod_has():
    own_init = {"name": "fetch-index", "image": "busybox", "command": ["wget", "http://yann.lecun.com/i"]}
    own_volume = {"name": "scratch", "emptyDir": {}}
    own_alias = {"ip": "10.1.2.3", "hostnames": ["own.example"]}
    own_security = {"runAsUser": 1000, "sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}
    result, patched = apply(pod(spec_extra={"initContainers": [own_init], "volumes": [own_volume],
                                            "hostAliases": [own_alias], "securityContext": own_security}))
    validate(patched)
    # First, so the pod's own init containers download through it too.
    assert [c["name"] for c in patched["spec"]["initContainers"]] == [sc.CONTAINER, "fetch-index"]
    assert patched["spec"]["initContainers"][1] == own_init
    assert patched["spec"]["volumes"][0] == own_volume and patched["spec"]["volumes"][1]["name"] == sc.VOLUME
    assert patched["spec"]["hostAliases"] == [own_alias, {"ip": "127.0.0.1", "hostnames": HOSTS}]
    assert patched["spec"]["securityContext"] == {"runAsUser": 1000, "sysctls": [
        {"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": sc.SYSCTL, "value": "0"}]}
    again, _ = apply(patched)
    assert again.ops == []


def test_a_pod_that_already_maps_a_host_keeps_its_entry_and_hears_of_it():
    result, patched = apply(pod(spec_extra={"hostAliases": [{"ip": "10.9.9.9", "hostnames": ["yann.lecun.com"]}]}))
    assert patched["spec"]["hostAliases"] == [{"ip": "10.9.9.9", "hostnames": ["yann.lecun.com"]},
                                              {"ip": "127.0.0.1", "hostnames": ["www.cs.toronto.edu"]}]
    assert any("yann.lecun.com already maps" in w for w in result.warnings)


def test_rules_without_the_key_stay_centralized_as_before():
    result, patched = apply(pod(), rule_set=rules(deployment=None))
    assert "initContainers" not in patched["spec"] and "securityContext" not in patched["spec"]
    assert patched["spec"]["hostAliases"] == [{"ip": "10.96.0.9", "hostnames": HOSTS}]
    assert sc.STATUS_ANNOTATION not in patched["metadata"]["annotations"] and result.status is None


def test_the_annotation_chooses_the_sidecar_for_a_pod_of_a_centralized_rule():
    result, patched = apply(pod(annotations={sc.DEPLOYMENT_ANNOTATION: "sidecar"}),
                            rule_set=rules(deployment="centralized"))
    assert the_sidecar(patched)["restartPolicy"] == "Always"
    assert patched["spec"]["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": HOSTS}]


def test_the_annotation_chooses_centralized_for_a_pod_of_a_sidecar_rule():
    result, patched = apply(pod(annotations={sc.DEPLOYMENT_ANNOTATION: "centralized"}))
    assert "initContainers" not in patched["spec"]
    assert patched["spec"]["hostAliases"] == [{"ip": "10.96.0.9", "hostnames": HOSTS}]


def test_an_invalid_deployment_annotation_is_named_and_the_pod_gets_the_rest_of_its_patch():
    obj = pod(annotations={sc.DEPLOYMENT_ANNOTATION: "sidecars"})
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "kind": {"kind": "Pod"}, "namespace": "ml", "operation": "CREATE", "object": obj}}
    decision = review(body, rules=rules(), cache_ip="10.96.0.9", sidecar=CONFIG)
    response = decision.response["response"]
    assert response["allowed"] is True
    assert any(sc.DEPLOYMENT_ANNOTATION in w and "'sidecars'" in w for w in response["warnings"]), response
    patched = jsonpatch.apply_patch(obj, decision.ops)
    assert the_sidecar(patched)  # the rule's own deployment still applies


def test_the_annotation_may_not_choose_the_sidecar_when_the_settings_forbid_it():
    config = sc.SidecarConfig(**{**CONFIG.__dict__, "by_annotation": False})
    result, patched = apply(pod(annotations={sc.DEPLOYMENT_ANNOTATION: "sidecar"}),
                            rule_set=rules(deployment="centralized"), config=config)
    assert "initContainers" not in patched["spec"]
    assert any("sidecar_by_annotation" in w for w in result.warnings)
    # Opting out to centralized is always allowed.
    result, patched = apply(pod(annotations={sc.DEPLOYMENT_ANNOTATION: "centralized"}), config=config)
    assert "initContainers" not in patched["spec"]


@pytest.mark.parametrize("version", [(1, 28), (1, 27), None])
def test_a_cluster_without_native_sidecars_gets_the_centralized_model_and_the_status_says_why(version):
    config = sc.SidecarConfig(**{**CONFIG.__dict__, "server_version": version})
    result, patched = apply(pod(), config=config)
    assert "initContainers" not in patched["spec"]
    assert patched["spec"]["hostAliases"] == [{"ip": "10.96.0.9", "hostnames": HOSTS}]
    status = patched["metadata"]["annotations"][sc.STATUS_ANNOTATION]
    assert status.startswith("centralized: ") and "1.29" in status
    if version is not None:
        assert f"{version[0]}.{version[1]}" in status
    assert result.fallback == status.removeprefix("centralized: ")
    again, _ = apply(patched, config=config)
    assert again.ops == []


def test_without_a_sidecar_image_the_pod_stays_centralized_and_says_why():
    config = sc.SidecarConfig(**{**CONFIG.__dict__, "image": None})
    _, patched = apply(pod(), config=config)
    assert "sidecar_image" in patched["metadata"]["annotations"][sc.STATUS_ANNOTATION]


def test_a_host_network_pod_stays_centralized():
    _, patched = apply(pod(spec_extra={"hostNetwork": True}))
    assert "initContainers" not in patched["spec"]
    assert "hostNetwork" in patched["metadata"]["annotations"][sc.STATUS_ANNOTATION]


def test_mode_env_points_the_proxy_variables_at_the_sidecar():
    _, patched = apply(pod(), rule_set=rules(mode="env"))
    env = {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]}
    assert env["HTTP_PROXY"] == env["http_proxy"] == "http://127.0.0.1:80"
    assert "env" not in the_sidecar(patched)  # the sidecar is the cache: it gets no proxy of its own
    again, _ = apply(patched, rule_set=rules(mode="env"))
    assert again.ops == []


def test_tls_rules_give_the_ca_to_the_training_containers_and_not_to_the_sidecar():
    _, patched = apply(pod(), rule_set=rules(tls=True))
    validate(patched)
    assert any(m["mountPath"] == "/etc/nezha/ca" for m in patched["spec"]["containers"][0]["volumeMounts"])
    side = the_sidecar(patched)
    assert {m["name"] for m in side["volumeMounts"]} == {sc.VOLUME, sc.HOSTS_VOLUME} and "env" not in side
    again, _ = apply(patched, rule_set=rules(tls=True))
    assert again.ops == []


def test_a_rule_with_an_unknown_deployment_is_refused_naming_it():
    with pytest.raises(RuleError, match="deployment must be one of centralized, sidecar, got 'pod'"):
        rules(deployment="pod")


@pytest.mark.parametrize("major,minor,version", [("1", "29", (1, 29)), ("1", "28+", (1, 28)), ("1", "", None),
                                                 ("x", "1", None)])
def test_the_server_version_is_read_as_providers_spell_it(major, minor, version):
    assert sc.parse_version(major, minor) == version


def test_a_pod_made_from_a_template_that_fell_back_stays_centralized_once_sidecars_are_possible():
    """The Job was admitted before the server's version was known; its pod, admitted after, keeps the decision
    (its aliases already point at the cluster: a sidecar would be bypassed)."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
           "spec": {"template": {"metadata": {"labels": {KEY: "true"}}, "spec": pod()["spec"]}}}
    _, patched_job = apply(job, kind="Job", config=sc.SidecarConfig(**{**CONFIG.__dict__, "server_version": None}))
    from_template = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {**patched_job["spec"]["template"]["metadata"], "name": "train-x", "namespace": "ml"},
                     "spec": patched_job["spec"]["template"]["spec"]}
    again, patched = apply(from_template)
    assert again.ops == [] and again.warnings == []
    assert patched["metadata"]["annotations"][sc.STATUS_ANNOTATION].startswith("centralized: ")
