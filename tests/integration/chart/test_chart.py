"""The Helm chart, rendered by the real `helm` and checked by the real `kubectl` and the Kubernetes 1.35 schemas.

What is asserted is what breaks a cluster when wrong: a webhook that can
block jobs, RBAC wider than docs/rbac.md, pods that run as root, a
StatefulSet whose replicas an upgrade would reset, a flag a component does
not take.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess

import kubernetes_validate
import pytest
import yaml

from testkit.tools import require_tool
from tests.integration.chart.render import (CHART, CI_VALUES, RenderError, find, helm, pod_specs, render,
                                            render_text)

K8S_VERSION = "1.35.0"
VALUE_SETS = [pytest.param((), id="defaults")] + [pytest.param((f,), id=f.stem) for f in CI_VALUES]


def test_the_ci_value_sets_chart_testing_runs_are_there():
    assert {f.name for f in CI_VALUES} >= {"external-redis-values.yaml", "autoscale-values.yaml",
                                           "two-origins-values.yaml", "fixed-clusterip-values.yaml"}


@pytest.mark.parametrize("values", VALUE_SETS)
def test_helm_lint_strict_passes(values):
    args = ["lint", "--strict", str(CHART)]
    for f in values:
        args += ["-f", str(f)]
    run = helm(*args, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_manifest_is_valid_against_the_kubernetes_1_35_schemas_strictly(values):
    """Custom resources (the Prometheus Operator's) are in no 1.35 schema: they are checked against the
    structure transcribed in prometheus_operator.py instead, never skipped."""
    import jsonschema

    from tests.integration.chart import prometheus_operator

    objects = render(values=values)
    assert objects
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            try:
                prometheus_operator.validate(obj)
            except jsonschema.ValidationError as e:
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.absolute_path)}")
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


@pytest.mark.parametrize("values", VALUE_SETS)
async def test_kubectl_apply_dry_run_client_accepts_the_rendered_output(values, tmp_path):
    """The real kubectl maps every kind through discovery (served by the API double) and accepts each object."""
    from testkit.kubeapi.kubeconfig import kubeconfig
    from testkit.kubeapi.server import KubeAPI

    kubectl = require_tool("kubectl")
    manifest = tmp_path / "nezha.yaml"
    manifest.write_text(render_text(values=values))
    api = KubeAPI()
    url = await api.start()
    try:
        config = kubeconfig(tmp_path / "kubeconfig", url)
        # Schema validation is the kubernetes-validate test above; the double serves no OpenAPI documents.
        proc = await asyncio.create_subprocess_exec(
            kubectl, "--kubeconfig", str(config), "apply", "--dry-run=client", "--validate=false",
            "--namespace", "nezha", "-f", str(manifest), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await api.stop()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert len(lines) == len([d for d in yaml.safe_load_all(manifest.read_text()) if d])
    assert all(line.endswith("created (dry run)") for line in lines), out.decode()


# -- the webhook can never block a job ------------------------------------------

def test_the_webhook_fails_open_and_leaves_out_kube_system_and_its_own_namespace():
    objects = render(namespace="caches")
    mwc = find(objects, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["timeoutSeconds"] <= 5
    assert hook["sideEffects"] == "None"
    assert hook["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "caches"]}]}
    service = hook["clientConfig"]["service"]
    assert (service["name"], service["namespace"], service["port"]) == ("nezha-webhook", "caches", 443)
    find(objects, "Service", "nezha-webhook")
    # caBundle is the certificates Job's: an upgrade that rendered it would reset it.
    assert "caBundle" not in hook["clientConfig"]


def test_the_chart_registration_matches_the_webhook_manifest_the_tests_register():
    """One registration: the chart's and webhook/manifests' differ only in names the release sets."""
    manifest = yaml.safe_load((CHART.parents[1] / "webhook" / "manifests" /
                               "mutatingwebhookconfiguration.yaml").read_text())
    chart = find(render(), "MutatingWebhookConfiguration")
    ours, theirs = chart["webhooks"][0], manifest["webhooks"][0]
    for key in ("name", "rules", "admissionReviewVersions", "sideEffects", "failurePolicy", "timeoutSeconds",
                "reinvocationPolicy", "matchPolicy", "namespaceSelector"):
        assert ours[key] == theirs[key], key


# -- RBAC: exactly docs/rbac.md ----------------------------------------------------

HTTPS_ONLY = "(with `https.terminate`)"  # a Role, or a row, that the chart grants only with that value


def _documented_rbac(*, https: bool) -> dict[tuple[str, str], dict[tuple[str, str], set[str]]]:
    """(kind, name) -> {(group, resource): verbs} from the tables under `### Role `x`` headings;
    what is marked HTTPS_ONLY only when `https` (the value set turns https.terminate on)."""
    doc = (CHART.parents[1] / "docs" / "rbac.md").read_text()
    out: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {}
    current = None
    for line in doc.splitlines():
        m = re.match(r"^### (Role|ClusterRole) `([^`]+)`", line)
        if m:
            current = out.setdefault((m.group(1), m.group(2)), {}) if https or HTTPS_ONLY not in line else None
            continue
        if line.startswith("#"):
            current = None
        if current is None or not line.startswith("| `") or (HTTPS_ONLY in line and not https):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        group = re.match(r"`([^`]*)`", cells[0]).group(1).strip('"')
        resource = re.match(r"`([^`]*)`", cells[1]).group(1)
        verbs = set(re.findall(r"`([a-z]+)`", cells[2]))
        current.setdefault((group, resource), set()).update(verbs)
    return out


def _granted(objects: list[dict]) -> dict[tuple[str, str], dict[tuple[str, str], set[str]]]:
    out: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {}
    for o in objects:
        if o["kind"] not in ("Role", "ClusterRole"):
            continue
        rules = out.setdefault((o["kind"], o["metadata"]["name"]), {})
        for rule in o["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    rules.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("values", VALUE_SETS)
def test_the_rbac_in_the_chart_is_exactly_docs_rbac_md(values):
    https = any(((yaml.safe_load(f.read_text()) or {}).get("https") or {}).get("terminate") for f in values)
    documented = _documented_rbac(https=https)
    assert documented, "docs/rbac.md has no '### Role `name`' tables"
    assert _granted(render(values=values)) == documented


@pytest.mark.parametrize("values", VALUE_SETS)
def test_no_rbac_rule_has_a_wildcard_and_every_binding_names_a_role_of_the_chart(values):
    objects = render(values=values)
    for o in objects:
        for rule in o.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in (rule.get(field) or []), f"{o['kind']}/{o['metadata']['name']}: {rule}"
    roles = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in ("Role", "ClusterRole")}
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    for o in objects:
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert (o["roleRef"]["kind"], o["roleRef"]["name"]) in roles
            assert o["kind"] == "RoleBinding" or o["roleRef"]["kind"] == "ClusterRole"
            assert all(s["name"] in accounts for s in o["subjects"])


def test_each_component_runs_as_its_own_service_account_and_cache_nodes_mount_no_token():
    objects = render()
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
    used = {owner["metadata"]["name"]: spec.get("serviceAccountName") for owner, spec in pod_specs(objects)}
    assert used["nezha-cache"] == "nezha-cache" and used["nezha-controller"] == "nezha-controller"
    assert used["nezha-webhook"] == "nezha-webhook" and used["nezha-webhook-certs"] == "nezha-webhook-certs"
    assert all(name in accounts for name in used.values() if name)
    cache = find(objects, "StatefulSet", "nezha-cache")["spec"]["template"]["spec"]
    assert cache["automountServiceAccountToken"] is False
    assert accounts["nezha-cache"]["automountServiceAccountToken"] is False


# -- pods: security, probes, env ---------------------------------------------------

@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_pod_is_non_root_read_only_without_capabilities_with_runtime_default_seccomp(values):
    for owner, spec in pod_specs(render(values=values)):
        where = f"{owner['kind']}/{owner['metadata']['name']}"
        pod = spec.get("securityContext") or {}
        assert pod.get("runAsNonRoot") is True and pod.get("runAsUser", 0) > 0, where
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c.get("securityContext") or {}
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("capabilities") == {"drop": ["ALL"]}, where
            assert c.get("resources", {}).get("requests"), f"{where}: no resource requests"


@pytest.mark.parametrize("values", VALUE_SETS)
def test_no_container_renders_an_env_name_twice(values):
    """Server-side apply (Helm 4) refuses duplicate keys in env, a list merged by name."""
    for owner, spec in pod_specs(render(values=values)):
        for c in spec["containers"]:
            names = [e["name"] for e in c.get("env") or []]
            assert len(names) == len(set(names)), f"{owner['metadata']['name']}/{c['name']}: {names}"


def test_long_running_components_have_probes_on_healthz_and_readyz():
    objects = render()
    for kind, name, ready, live in [("StatefulSet", "nezha-cache", "/readyz", "/healthz"),
                                    ("Deployment", "nezha-controller", "/readyz", "/healthz"),
                                    ("Deployment", "nezha-webhook", "/readyz", "/healthz")]:
        (c,) = find(objects, kind, name)["spec"]["template"]["spec"]["containers"]
        assert c["readinessProbe"]["httpGet"]["path"] == ready, name
        assert c["livenessProbe"]["httpGet"]["path"] == live, name
        ports = {p["name"] for p in c["ports"]}
        assert c["readinessProbe"]["httpGet"]["port"] in ports
    (redis,) = find(objects, "StatefulSet", "nezha-redis")["spec"]["template"]["spec"]["containers"]
    assert redis["readinessProbe"]["tcpSocket"]["port"] == "redis"


def test_every_object_carries_the_standard_labels():
    for o in render():
        labels = o["metadata"].get("labels") or {}
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "app.kubernetes.io/component", "helm.sh/chart"):
            assert key in labels, f"{o['kind']}/{o['metadata']['name']} lacks {key}"


# -- the cache StatefulSet -----------------------------------------------------------

def test_the_cache_statefulset_is_parallel_with_its_peer_service_and_a_claim_template():
    objects = render(values=[CHART / "ci" / "fixed-clusterip-values.yaml"])
    sts = find(objects, "StatefulSet", "nezha-cache")
    spec = sts["spec"]
    assert spec["serviceName"] == "nezha-cache-peers"
    assert spec["podManagementPolicy"] == "Parallel"
    peers = find(objects, "Service", "nezha-cache-peers")["spec"]
    assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True
    assert peers["selector"] == spec["selector"]["matchLabels"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    (c,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    # The node hands off within the grace period, with time left before SIGKILL.
    assert float(env["NEZHA_SHUTDOWN_GRACE"]["value"]) == 115
    cache = find(objects, "Service", "nezha-cache")["spec"]
    assert cache["clusterIP"] == "10.96.200.200" and cache["ports"][0]["port"] == 80


def test_the_cache_service_answers_https_on_443_from_each_nodes_tls_port():
    """An aliased host's https:// URL lands on the Service's 443; the node relays
    it to the real host (docs/cache-node.md, "Port 443")."""
    objects = render()
    ports = {p["name"]: p for p in find(objects, "Service", "nezha-cache")["spec"]["ports"]}
    assert (ports["http"]["port"], ports["http"]["targetPort"]) == (80, "http")
    assert (ports["https"]["port"], ports["https"]["targetPort"]) == (443, "tls")
    (c,) = find(objects, "StatefulSet", "nezha-cache")["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 8080, "tls": 8443}
    assert "--tls-listen=$(POD_IP):8443" in c["args"]


def test_node_identity_and_address_come_from_the_downward_api():
    sts = find(render(), "StatefulSet", "nezha-cache")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "--node-id=$(POD_NAME)" in c["args"]
    assert "--listen=$(POD_IP):8080" in c["args"]
    assert "--advertise=$(POD_NAME).nezha-cache-peers.$(POD_NAMESPACE).svc:8080" in c["args"]
    assert env["NEZHA_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "nezha-cluster-token", "key": "token"}
    # $(VAR) expands only variables defined before it.
    order = [e["name"] for e in c["env"]]
    assert order.index("REDIS_PASSWORD") < order.index("NEZHA_REDIS_URL")


def test_origins_and_capacity_reach_the_nodes_settings_file():
    objects = render(values=[CHART / "ci" / "two-origins-values.yaml"])
    config = yaml.safe_load(find(objects, "ConfigMap", "nezha-cache")["data"]["cache.yaml"])
    from nezha.config import CacheSettings

    settings = CacheSettings(**config, capacity="45GiB")
    assert [o.host for o in settings.origins] == ["www.cs.toronto.edu", "datasets.example.org"]
    assert settings.origins[0].default_ttl == 86400
    assert settings.origins[1].volatile_params == ("X-Amz-Signature", "X-Amz-Date")
    assert (settings.origins[1].credentials, settings.origins[1].credential_params) == ("authorize", ("token",))
    assert (settings.origins[0].credentials, settings.origins[0].credential_params) == ("pass", ())
    assert settings.origins[0].targeted_cache_control == ("Nezha-Cache-Control", "CDN-Cache-Control")
    assert settings.origins[1].targeted_cache_control == ("Nezha-Cache-Control",)
    assert settings.chunking(settings.origins[0]) == (512 * 2**20, 32 * 2**20)
    assert settings.chunking(settings.origins[1]) == (0, 64 * 2**20)  # chunking off; the node's chunk size
    # A config change rolls the nodes.
    sts = find(objects, "StatefulSet", "nezha-cache")
    assert sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != \
        find(render(), "StatefulSet", "nezha-cache")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_the_controller_annotations_come_from_values():
    sts = find(render(values=[CHART / "ci" / "autoscale-values.yaml"]), "StatefulSet", "nezha-cache")
    notes = sts["metadata"]["annotations"]
    assert notes["nezha.io/autoscale"] == "true"
    assert (notes["nezha.io/min-replicas"], notes["nezha.io/max-replicas"]) == ("2", "8")
    assert notes["nezha.io/target-bytes-per-second"] == "500M"
    assert notes["nezha.io/scale-down-delay"] == "600"
    assert notes["nezha.io/replicas-per-key"] == "2"
    from controller.annotations import read_spec

    spec, problems = read_spec(notes)
    assert not problems and spec.autoscale and spec.min_replicas == 2 and spec.max_replicas == 8
    plain = find(render(), "StatefulSet", "nezha-cache")["metadata"]["annotations"]
    assert "nezha.io/autoscale" not in plain


def test_a_fresh_install_renders_cache_replicas_from_values():
    sts = find(render(sets=["cache.replicas=4"]), "StatefulSet", "nezha-cache")
    assert sts["spec"]["replicas"] == 4


def test_hot_copies_are_tuned_or_turned_off_from_values(tmp_path):
    values = tmp_path / "hot.yaml"  # a file: `--set` would pass 0.25 as a string
    values.write_text(yaml.safe_dump({"cache": {"hotCopies": {"reads": 0, "windowSeconds": 30, "share": 0.25}}}))
    for objects, want in ((render(), ("3", "60", "0.1")), (render(values=[values]), ("0", "30", "0.25"))):
        args = find(objects, "StatefulSet", "nezha-cache")["spec"]["template"]["spec"]["containers"][0]["args"]
        flags = dict(a.split("=", 1) for a in args if a.startswith("--hot-"))
        assert (flags["--hot-reads"], flags["--hot-window"], flags["--hot-share"]) == want
    # The settings file stays one the controller reads too: it knows no hot copies, and refuses unknown keys.
    from nezha.config import ControllerSettings, load

    shared = tmp_path / "cache.yaml"
    shared.write_text(find(render(values=[values]), "ConfigMap", "nezha-cache")["data"]["cache.yaml"])
    load(ControllerSettings, config_file=shared, flags={"namespace": "nezha", "statefulset": "nezha-cache",
                                                         "redis_url": "redis://127.0.0.1:6379"})


@pytest.mark.parametrize("sets, workers", [
    ([], 1),  # no CPU limit: the pod may share its machine, and each worker costs memory
    (["cache.resources.limits.cpu=4"], 4),
    (["cache.resources.limits.cpu=1500m"], 2),  # a partial CPU still gets its worker
    (["cache.resources.limits.cpu=0.5"], 1),
    (["cache.resources.limits.cpu=4", "cache.workers=3"], 3),
])
def test_cache_nodes_run_a_worker_per_cpu_of_their_limit_unless_told(sets, workers):
    sts = find(render(sets=sets), "StatefulSet", "nezha-cache")
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--workers={workers}" in args


# -- the controller and the webhook -------------------------------------------------

def test_two_controllers_elect_a_leader_for_the_charts_statefulset():
    objects = render()
    dep = find(objects, "Deployment", "nezha-controller")
    assert dep["spec"]["replicas"] == 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert "--statefulset=nezha-cache" in c["args"] and "--lease-name=nezha-controller" in c["args"]
    assert "--identity=$(POD_NAME)" in c["args"]
    role = find(objects, "Role", "nezha-controller")
    narrowed = [r for r in role["rules"] if r.get("resourceNames")]
    assert narrowed == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                         "resourceNames": ["nezha-controller"], "verbs": ["get", "update"]}]


def test_the_webhook_runs_twice_with_a_budget_and_spreads_over_nodes():
    objects = render()
    dep = find(objects, "Deployment", "nezha-webhook")
    assert dep["spec"]["replicas"] == 2
    affinity = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    pdb = find(objects, "PodDisruptionBudget", "nezha-webhook")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert find(objects, "PodDisruptionBudget", "nezha-cache")["spec"]["maxUnavailable"] == 1


def test_the_webhook_certificate_is_made_by_a_job_each_revision_and_renewed_by_a_cronjob():
    objects = render()
    job = next(o for o in objects if o["kind"] == "Job")
    assert job["metadata"]["name"] == "nezha-webhook-certs-1"
    cron = find(objects, "CronJob", "nezha-webhook-certs")
    for spec in (job["spec"]["template"]["spec"], cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]):
        (c,) = spec["containers"]
        assert c["args"][:2] == ["webhook", "certs"]
        assert "--webhook-configuration=nezha-webhook" in c["args"] and "--secret=nezha-webhook-tls" in c["args"]
    dep = find(objects, "Deployment", "nezha-webhook")
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "nezha-webhook-tls"


def test_the_rules_configmap_is_in_the_original_nezha_format_and_names_no_ip():
    from webhook.rules import parse_rules

    objects = render()
    text = find(objects, "ConfigMap", "nezha-webhook-rules")["data"]["config"]
    raw = yaml.safe_load(text)
    assert set(raw[0]) == {"name", "app", "label", "hostAliases"}
    assert all("ip" not in alias for rule in raw for alias in rule["hostAliases"])
    rules = parse_rules(text)
    assert (rules[0].label_key, rules[0].label_value) == ("nezha.io/cache", "true")
    assert rules[0].host_aliases[0].ip is None
    two = yaml.safe_load(find(render(values=[CHART / "ci" / "two-origins-values.yaml"]), "ConfigMap",
                              "nezha-webhook-rules")["data"]["config"])
    assert [r["name"] for r in two] == ["cifar", "mirror"]
    assert len(parse_rules(yaml.safe_dump(two))) == 2


# -- Redis ---------------------------------------------------------------------------

def test_the_default_redis_is_one_debian_instance_with_appendonly_and_a_kept_password():
    objects = render()
    sts = find(objects, "StatefulSet", "nezha-redis")
    assert sts["spec"]["replicas"] == 1
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert "bookworm" in c["image"]
    args = c["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    secret = find(objects, "Secret", "nezha-redis")
    assert set(secret["data"]) == {"password"}
    assert "volumeClaimTemplates" not in sts["spec"]
    persistent = find(render(values=[CHART / "ci" / "fixed-clusterip-values.yaml"]), "StatefulSet", "nezha-redis")
    assert persistent["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "standard"


def test_an_external_redis_replaces_the_charts_own_and_its_password_comes_from_the_users_secret():
    objects = render(values=[CHART / "ci" / "external-redis-values.yaml"])
    assert not [o for o in objects if "redis" in o["metadata"]["name"]]
    for name in ("nezha-cache", "nezha-controller"):
        kind = "StatefulSet" if name == "nezha-cache" else "Deployment"
        (c,) = find(objects, kind, name)["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "redis-credentials",
                                                                      "key": "redis-password"}
        assert env["NEZHA_REDIS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@redis-master.data.svc:6379/2"


# -- every flag the chart passes is one the command takes -------------------------------

@pytest.mark.parametrize("values", VALUE_SETS)
def test_every_nezha_command_line_in_the_chart_parses(values):
    from nezha.cli import build_parser

    parser = build_parser()
    seen = set()
    for owner, spec in pod_specs(render(values=values)):
        for c in spec["containers"]:
            if c["image"].split(":")[0] != "nezha" or c.get("command"):
                continue
            try:
                args = parser.parse_args(c["args"])
            except SystemExit:
                pytest.fail(f"{owner['metadata']['name']}: nezha {shlex.join(c['args'])} does not parse")
            seen.add(" ".join(c["args"][:2]) if c["args"][:2] in (["webhook", "certs"], ["ca", "init"])
                     else c["args"][0])
            assert args.func is not None
    https = any(((yaml.safe_load(f.read_text()) or {}).get("https") or {}).get("terminate") for f in values)
    assert seen == {"cache", "controller", "webhook", "webhook certs"} | ({"ca init"} if https else set())


# -- values.schema.json refuses bad values, naming the field ----------------------------

@pytest.mark.parametrize("sets,field", [
    (["cache.replicas=0"], "/cache/replicas"),
    (["cache.capacity=lots"], "/cache/capacity"),
    (["cache.capasity=1GiB"], "capasity"),
    (["cache.autoscale.maxReplicas=0"], "/cache/autoscale/maxReplicas"),
    (["webhook.timeoutSeconds=10"], "/webhook/timeoutSeconds"),
    (["redis.external.url=http://redis:6379"], "/redis/external/url"),
    (["cache.autoscale.minReplicas=5", "cache.autoscale.maxReplicas=3"], "cache.autoscale.minReplicas"),
    (["webhook.certs.renewDays=400"], "webhook.certs.renewDays"),
    (["cache.service.port=8080"], "port"),
])
def test_a_bad_value_is_refused_with_its_field_named(sets, field):
    with pytest.raises(RenderError) as e:
        render(sets=sets)
    assert field in str(e.value)


def test_an_origin_without_a_url_is_refused_naming_it(tmp_path):
    values = tmp_path / "v.yaml"
    values.write_text("origins:\n  - host: datasets.example.org\n")
    with pytest.raises(RenderError) as e:
        render(values=[values])
    assert "/origins/0" in str(e.value) and "upstream" in str(e.value)


def test_an_empty_targeted_cache_control_reaches_the_node_as_empty(tmp_path):
    """[] is a choice (Cache-Control alone rules), not the default."""
    values = tmp_path / "v.yaml"
    values.write_text("origins:\n  - host: datasets.example.org\n    upstream: http://mirror.example.org\n"
                      "    targetedCacheControl: []\n")
    config = yaml.safe_load(find(render(values=[values]), "ConfigMap", "nezha-cache")["data"]["cache.yaml"])
    from nezha.config import CacheSettings

    assert CacheSettings(**config).origins[0].targeted_cache_control == ()


@pytest.mark.parametrize("listed", ["[Cache-Control]", "['not a field']", "[CDN-Cache-Control, CDN-Cache-Control]"])
def test_a_targeted_cache_control_that_names_no_targeted_field_is_refused(tmp_path, listed):
    values = tmp_path / "v.yaml"
    values.write_text("origins:\n  - host: datasets.example.org\n    upstream: http://mirror.example.org\n"
                      f"    targetedCacheControl: {listed}\n")
    with pytest.raises(RenderError) as e:
        render(values=[values])
    assert "/origins/0/targetedCacheControl" in str(e.value)


def test_notes_say_how_to_label_a_job_scale_and_read_stats():
    run = helm("install", "nezha", str(CHART), "--namespace", "nezha", "--dry-run=client")
    notes = run.stdout.split("NOTES:", 1)[1]
    assert 'nezha.io/cache: "true"' in notes
    assert "kubectl -n nezha scale statefulset nezha-cache --replicas=5" in notes
    assert "redis-cli" in notes and "HGETALL nezha:stats:cluster" in notes and "nezha stats" in notes


def test_a_sentinel_url_gets_the_password_spliced_in_and_parses_as_every_command_takes_it():
    objects = render(sets=["redis.external.url=redis+sentinel://s1:26379\\,s2:26379/mymaster/2",
                           "redis.external.passwordSecret.name=redis-credentials"])
    (c,) = find(objects, "Deployment", "nezha-controller")["spec"]["template"]["spec"]["containers"]
    url = {e["name"]: e for e in c["env"]}["NEZHA_REDIS_URL"]["value"]
    assert url == "redis+sentinel://:$(REDIS_PASSWORD)@s1:26379,s2:26379/mymaster/2"
    from nezha.redis_url import parse_sentinel

    target = parse_sentinel(url.replace("$(REDIS_PASSWORD)", "pw"))
    assert target.sentinels == (("s1", 26379), ("s2", 26379)) and target.service == "mymaster"


# -- HTTPS (issue 13): the CA's key reaches cache pods only --------------------------------

HTTPS_VALUES = CHART / "ci" / "https-values.yaml"


def test_with_https_only_cache_pods_mount_the_ca_key_and_every_part_is_wired():
    objects = render(values=(HTTPS_VALUES,))
    mounting = {}
    for owner, spec in pod_specs(objects):
        for v in spec.get("volumes") or []:
            if (v.get("secret") or {}).get("secretName") == "nezha-ca-key":
                mounting[owner["metadata"]["name"]] = v
    assert list(mounting) == ["nezha-cache"] and mounting["nezha-cache"]["secret"]["defaultMode"] == 0o400
    cache = find(objects, "StatefulSet", "nezha-cache")["spec"]["template"]["spec"]["containers"][0]
    assert {"--ca-cert=/var/run/nezha/ca/ca.crt", "--ca-key=/var/run/nezha/ca/ca.key"} <= set(cache["args"])
    controller = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "nezha-controller")
    assert "--publish-ca" in controller["spec"]["template"]["spec"]["containers"][0]["args"]
    job = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("nezha-ca-"))
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["ca", "init"]
    rules = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap"
                                and o["metadata"]["name"] == "nezha-webhook-rules")["data"]["config"])
    assert rules[0]["tls"] is True
    table = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap"
                                and o["metadata"]["name"] == "nezha-cache")["data"]["cache.yaml"])
    assert {o["host"]: o.get("tls") for o in table["origins"]}["pinned.example.org"] == "passthrough"


def test_without_https_nothing_of_the_ca_is_rendered():
    objects = render()
    text = yaml.safe_dump_all(objects)
    assert "nezha-ca-key" not in text and "--publish-ca" not in text and "--ca-cert" not in text
    assert not any(o["kind"] == "Job" and o["metadata"]["name"].startswith("nezha-ca-") for o in objects)


def test_with_https_and_rules_of_their_own_a_host_no_tls_rule_aliases_is_passed_through(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "https": {"terminate": True},
        "origins": [{"host": "storage.googleapis.com", "upstream": "https://storage.googleapis.com"},
                    {"host": "www.cs.toronto.edu", "upstream": "http://www.cs.toronto.edu"},
                    {"host": "*.s3.amazonaws.com", "upstream": "https://{host}"},
                    {"host": "huggingface.co", "upstream": "https://huggingface.co"}],
        "webhook": {"rules": [
            {"name": "secure", "app": "team", "label": "vision", "tls": True,
             "hostAliases": [{"hostnames": ["storage.googleapis.com", "datasets.s3.amazonaws.com"]}]},
            {"name": "plain", "app": "team", "label": "nlp",
             "hostAliases": [{"hostnames": ["www.cs.toronto.edu", "huggingface.co"]}]}]}}))
    objects = render(values=(values,))
    table = yaml.safe_load(find(objects, "ConfigMap", "nezha-cache")["data"]["cache.yaml"])
    assert {o["host"]: o.get("tls") for o in table["origins"]} == {
        "storage.googleapis.com": None, "*.s3.amazonaws.com": None,  # a tls rule aliases them (a bucket under it)
        "www.cs.toronto.edu": "passthrough", "huggingface.co": "passthrough"}  # only a plain rule does


def test_the_default_rule_leaves_wildcard_origins_out_since_etc_hosts_has_no_patterns(tmp_path):
    from webhook.rules import parse_rules

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"origins": [
        {"host": "storage.googleapis.com", "upstream": "https://storage.googleapis.com"},
        {"host": "*.s3.amazonaws.com", "upstream": "https://{host}"}]}))
    rules = parse_rules(find(render(values=(values,)), "ConfigMap", "nezha-webhook-rules")["data"]["config"])
    assert [a.hostnames for a in rules[0].host_aliases] == [("storage.googleapis.com",)]
