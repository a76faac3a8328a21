"""What `helm install` prints works when pasted: the example Job is one the webhook patches, and an image
that cannot be pulled is named before a user meets ImagePullBackOff.

The notes come from the real `helm install --dry-run=client`; the example
command runs in bash, its `kubectl` the real one against the API double
(`--dry-run=client`), and the Job it would create is checked against the
Kubernetes 1.35 schemas and run through the webhook's own rules.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from testkit.tools import require_tool
from tests.integration.chart.render import CHART, find, helm, render
from webhook.patch import patch_for
from webhook.rules import rules_from

K8S_VERSION = "1.35.0"
# The pasteable command: from `kubectl ... <<'EOF'` to the line `EOF`.
PASTE = re.compile(r"^(kubectl [^\n]*<<'EOF'\n.*?\nEOF)$", re.M | re.S)


def notes(*args: str, namespace: str = "nezha") -> str:
    run = helm("install", "nezha", str(CHART), "--namespace", namespace, "--dry-run=client", *args)
    return run.stdout.split("NOTES:", 1)[1]


async def run_pasted(command: str, tmp_path: Path) -> tuple[str, dict]:
    """Runs `command` in bash with a `kubectl` that is the real one, dry-run, against the API double.

    Returns the namespace kubectl was given and the object it would create.
    """
    from testkit.kubeapi.kubeconfig import kubeconfig
    from testkit.kubeapi.server import KubeAPI

    real = require_tool("kubectl")
    bash = require_tool("bash")
    api = KubeAPI()
    url = await api.start()
    try:
        config = kubeconfig(tmp_path / "kubeconfig", url)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "kubectl"
        # Schema validation is kubernetes-validate's below; the double serves no OpenAPI documents.
        wrapper.write_text(f'#!/bin/sh\nexec {real} --kubeconfig {config} "$@" --dry-run=client --validate=false '
                           '-o yaml\n')
        wrapper.chmod(0o755)
        script = tmp_path / "pasted.sh"
        script.write_text(command + "\n")
        proc = await asyncio.create_subprocess_exec(
            bash, "-eu", str(script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"})
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await api.stop()
    assert proc.returncode == 0, err.decode()
    namespace = re.match(r"kubectl -n (\S+) ", command)
    assert namespace, f"the pasted command names no namespace: {command.splitlines()[0]}"
    return namespace.group(1), yaml.safe_load(out.decode())


@pytest.mark.parametrize("values", [(), (CHART / "ci" / "two-origins-values.yaml",)], ids=["defaults", "rules"])
async def test_the_example_job_in_the_notes_is_valid_and_gets_host_aliases_from_the_charts_rules(values, tmp_path):
    args = [a for f in values for a in ("-f", str(f))]
    printed = notes(*args)
    (command,) = PASTE.findall(printed)
    namespace, job = await run_pasted(command, tmp_path)
    assert job["kind"] == "Job"
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert namespace not in ("kube-system", "nezha"), "the webhook skips this namespace"

    rules = rules_from(yaml.safe_load(find(render(values=values), "ConfigMap", "nezha-webhook-rules")["data"]["config"]))
    patch = patch_for(obj=job, kind="Job", namespace=namespace, rules=rules, cache_ip="10.96.0.10")
    assert patch.rules, f"no rule matches the example Job's labels {job['spec']['template']['metadata']['labels']}"
    aliases = [op for op in patch.ops if op["path"].endswith("/hostAliases")]
    assert aliases, patch.ops
    (container,) = job["spec"]["template"]["spec"]["containers"]
    host = re.match(r"http://([^/]+)/", container["command"][-1]).group(1)
    assert host in {h for op in aliases for alias in op["value"] for h in alias["hostnames"]}
    # The check the notes print next selects the Job's pods by the label the Job controller sets.
    assert f"kubectl -n {namespace} get pod -l job-name={job['metadata']['name']} " in printed


def test_the_notes_warn_with_the_build_and_push_commands_while_the_image_is_the_default():
    printed = notes()
    assert "WARNING: image.repository" in printed and "no Nezha" in printed and "ImagePullBackOff" in printed
    assert "docker build -t REGISTRY/nezha:0.1.0 ." in printed
    assert "docker push REGISTRY/nezha:0.1.0" in printed
    assert "--set image.repository=REGISTRY/nezha" in printed
    tagged = notes("--set", "image.tag=0.2.0")
    assert "docker push REGISTRY/nezha:0.2.0" in tagged


def test_the_notes_do_not_warn_once_the_image_is_the_users():
    printed = notes("--set", "image.repository=registry.example.org/ml/nezha")
    assert "WARNING" not in printed and "docker push" not in printed
