"""What `helm install` prints says what the values turned on, and each check it prints works.

With the chart's CI values for HTTPS, monitoring, sidecars and Redis HA, the
notes gain a section for each, naming what was made and a command that shows
it at work. The notes come from the real `helm install --dry-run=client`.
The commands that read the cluster run in bash with the real `kubectl` (and
`openssl`) against the API double, on objects made as the cluster would make
them: the CA by `nezha ca init`'s own code, the example Job's pod from its
template as the webhook's own rules patch it. The monitoring names are checked
against the objects the chart renders. The Redis HA command runs, in
tests/integration/system/test_redis_ha_notes.py, against the chart's own
Redis and Sentinel containers.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import subprocess
from pathlib import Path

import jsonpatch
import pytest
import yaml

from testkit.kubeapi.fixtures import kube, kube_api, kube_target  # noqa: F401  (fixtures)
from testkit.tools import require_tool
from tests.integration.chart.render import CHART, find, render
from tests.integration.chart.test_chart_notes import PASTE, notes
from tests.integration.chart.test_chart_sidecar import webhook_settings
from webhook.patch import patch_for
from webhook.rules import parse_rules
from webhook.server import sidecar_config

CI = CHART / "ci"
SECTION = "5. What your values turned on"


def values(*names: str) -> list[str]:
    return [a for n in names for a in ("-f", str(CI / f"{n}-values.yaml"))]


def command(printed: str, fragment: str) -> str:
    """The one printed command line holding `fragment`, with its continuation lines joined."""
    text = re.sub(r"\\\n\s*", "", printed)
    (line,) = [line.strip() for line in text.splitlines() if fragment in line]
    return line


def section(printed: str, title: str) -> str:
    """The paragraph of section 5 that starts with `title`, up to the next one."""
    rest = printed.split(SECTION, 1)[1]
    parts = re.split(r"\n\n(?=   \S)", rest)
    (part,) = [p for p in parts if p.strip().startswith(title)]
    return part


async def run_kubectl(line: str, api, tmp_path: Path) -> subprocess.CompletedProcess:
    """`line` in bash, its `kubectl` the real one talking to the API double."""
    from testkit.kubeapi.kubeconfig import kubeconfig

    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "kubectl"
    wrapper.write_text(f'#!/bin/sh\nexec {require_tool("kubectl")} --kubeconfig {config} "$@"\n')
    wrapper.chmod(0o755)
    proc = await asyncio.create_subprocess_exec(
        require_tool("bash"), "-c", line, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return subprocess.CompletedProcess(line, proc.returncode, out.decode(), err.decode())


def example_job(printed: str) -> tuple[str, dict]:
    """The example Job the notes print, as (namespace, object)."""
    (pasted,) = PASTE.findall(printed)
    namespace = re.match(r"kubectl -n (\S+) ", pasted).group(1)
    body = pasted.split("\n", 1)[1].rsplit("\nEOF", 1)[0]
    return namespace, yaml.safe_load(body)


async def create_pod_of(kube, job: dict, namespace: str, *, sidecar=None, rules=None) -> None:
    """The pod the Job controller would make, from the template as the webhook patched it (unpatched without rules)."""
    from kubernetes_asyncio import client

    if rules is not None:
        patch = patch_for(obj=job, kind="Job", namespace=namespace, rules=rules, cache_ip="10.96.0.10",
                          proxy_url="http://nezha-cache.nezha.svc:80", sidecar=sidecar)
        job = jsonpatch.apply_patch(job, patch.ops)
    template = copy.deepcopy(job["spec"]["template"])
    meta = template["metadata"]
    meta["name"] = f"{job['metadata']['name']}-x1"
    meta["labels"] = {**meta.get("labels", {}), "job-name": job["metadata"]["name"]}
    core = client.CoreV1Api(kube)
    try:
        await core.create_namespace({"metadata": {"name": namespace}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    await core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", **template})


def rendered_rules(objects: list[dict]):
    return parse_rules(find(objects, "ConfigMap", "nezha-webhook-rules")["data"]["config"])


# -- which sections appear -------------------------------------------------------------------------------

def test_the_default_values_turn_nothing_on_that_needs_a_section():
    assert SECTION not in notes()


@pytest.mark.parametrize("name,title", [
    ("https", "HTTPS (https.terminate: true)"),
    ("metrics", "Monitoring"),
    ("sidecar", "Sidecar caches"),
    ("redis-ha", "Redis HA (redis.ha.enabled)"),
])
def test_each_value_that_turns_something_on_gets_its_section_and_no_other(name, title):
    printed = notes(*values(name))
    titles = ["HTTPS (https.terminate: true)", "Monitoring", "Sidecar caches", "Redis HA (redis.ha.enabled)"]
    assert [t for t in titles if re.search(rf"^   {re.escape(t)}", printed, re.M)] == [title]


# -- HTTPS -----------------------------------------------------------------------------------------------

async def test_the_ca_check_prints_the_ca_nezha_ca_init_made_and_fails_before_it_exists(kube, kube_api, tmp_path):
    from kubernetes_asyncio import client

    from nezha.ca_cli import init_in_cluster

    require_tool("openssl")  # the printed check pipes the CA into openssl, as a user's shell would
    printed = notes(*values("https"))
    line = command(printed, "get configmap nezha-ca -o jsonpath")
    assert line.startswith("kubectl -n nezha ") and "| openssl x509" in line
    await client.CoreV1Api(kube).create_namespace({"metadata": {"name": "nezha"}})
    before = await run_kubectl(line, kube_api, tmp_path)
    assert before.returncode != 0
    await init_in_cluster(kube, "nezha")
    after = await run_kubectl(line, kube_api, tmp_path)
    assert after.returncode == 0, after.stderr
    assert re.search(r"^subject=CN ?= ?nezha-ca-\d+$", after.stdout, re.M), after.stdout
    assert re.search(r"^notAfter=", after.stdout, re.M)


async def test_the_example_jobs_pod_shows_the_ca_volume_the_default_tls_rule_gives_it(kube, kube_api, tmp_path):
    printed = notes(*values("https"))
    line = command(printed, "configMap.name}'")
    namespace, job = example_job(printed)
    await create_pod_of(kube, job, namespace)
    unpatched = await run_kubectl(line, kube_api, tmp_path)
    assert unpatched.returncode == 0 and unpatched.stdout == "", unpatched.stderr
    from kubernetes_asyncio import client
    await client.CoreV1Api(kube).delete_namespaced_pod(f"{job['metadata']['name']}-x1", namespace)
    await create_pod_of(kube, job, namespace, rules=rendered_rules(render(values=[CI / "https-values.yaml"])))
    shown = await run_kubectl(line, kube_api, tmp_path)
    assert shown.returncode == 0 and shown.stdout == "nezha-ca", shown.stderr


def passthrough_hosts(objects: list[dict]) -> set[str]:
    table = yaml.safe_load(find(objects, "ConfigMap", "nezha-cache")["data"]["cache.yaml"])
    return {o["host"] for o in table["origins"] if o.get("tls") == "passthrough"}


@pytest.mark.parametrize("names", [("https",), ("https", "two-origins"), ("https", "sidecar")])
def test_the_https_section_names_the_rules_that_trust_the_ca_and_the_hosts_the_nodes_pass_through(names):
    printed = notes(*values(*names))
    part = section(printed, "HTTPS")
    objects = render(values=[CI / f"{n}-values.yaml" for n in names])
    listed = re.search(r"uncached \([^)]*\): (.+?)\.(?= |$)", " ".join(part.split()))
    assert set(listed.group(1).split(", ") if listed else ()) == passthrough_hosts(objects)
    rules = rendered_rules(objects)
    if names == ("https",):
        assert "tls: true: the default rule, datasets." in part and [r.tls for r in rules] == [True]
    else:
        plain = [r.name for r in rules if not r.tls]
        assert "tls: true: no rule." in part and f"Without tls: true: {', '.join(plain)}." in part


# -- monitoring -------------------------------------------------------------------------------------------

def test_the_monitoring_section_names_the_objects_and_labels_the_chart_renders():
    printed = notes(*values("metrics"))
    part = " ".join(section(printed, "Monitoring").split())
    objects = render(values=[CI / "metrics-values.yaml"])
    monitors = [o for o in objects if o["kind"] == "PodMonitor"]
    selector = re.search(r"get podmonitors -l (\S+)=(\S+)", part)
    assert len(monitors) == 3 and all(m["metadata"]["labels"][selector.group(1)] == selector.group(2)
                                      for m in monitors)
    assert "podMonitorSelector matches release=prometheus" in part
    jobs = re.search(r'up\{job=~"([^"]+)"\}', part).group(1).split("|")
    relabelled = {r["replacement"] for m in monitors for e in m["spec"]["podMetricsEndpoints"]
                  for r in e["relabelings"] if r["targetLabel"] == "job"}
    assert set(jobs) == relabelled
    rule_name = re.search(r"get prometheusrule (\S+) -o jsonpath='\{\.spec\.groups\[\*\]\.rules\[\*\]\.alert\}'",
                          part).group(1)
    rule = find(objects, "PrometheusRule", rule_name)
    assert [g["name"] for g in rule["spec"]["groups"]] == ["nezha"] and "lists group nezha" in part
    assert all(r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"])
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    board = re.search(r"-n (\S+) get configmap (\S+) --show-labels", part)
    dashboard = find(objects, "ConfigMap", board.group(2))
    assert dashboard["metadata"]["namespace"] == board.group(1)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    title = yaml.safe_load(dashboard["data"]["nezha.json"])["title"]
    assert f'lists it as "{title}"' in part


def test_alerts_without_the_charts_pod_monitors_say_which_job_labels_they_need():
    printed = notes("--set", "metrics.prometheusRule.enabled=true")
    part = " ".join(section(printed, "Monitoring").split())
    assert "get podmonitors" not in part and "select on the job labels the chart's PodMonitors set" in part


# -- sidecars ---------------------------------------------------------------------------------------------

async def test_the_example_jobs_pod_shows_it_got_a_sidecar(kube, kube_api, tmp_path):
    printed = notes(*values("sidecar"))
    part = " ".join(section(printed, "Sidecar caches").split())
    objects = render(values=[CI / "sidecar-values.yaml"])
    rules = rendered_rules(objects)
    assert f"pods of {', '.join(r.name for r in rules if r.deployment == 'sidecar')} get a cache" in part
    assert "cannot ask for a sidecar by annotation" in part
    line = command(printed, "-l job-name=nezha-try -o jsonpath='{.items[0].metadata.annotations")
    namespace, job = example_job(printed)
    config = sidecar_config(webhook_settings(objects, tmp_path), (1, 35))
    await create_pod_of(kube, job, namespace, sidecar=config, rules=rules)
    shown = await run_kubectl(line, kube_api, tmp_path)
    assert shown.returncode == 0 and shown.stdout == "sidecar", shown.stderr
    assert "a cache of its own in the pod (deployment: sidecar)" in " ".join(printed.split())
