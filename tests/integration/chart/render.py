"""The chart as `helm template` renders it: the objects every chart test and the whole-system test start from."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterable

import yaml

from testkit.tools import require_tool

CHART = Path(__file__).resolve().parents[3] / "helm" / "nezha"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("helm"), *args], capture_output=True, text=True, timeout=120, check=check)


def render_text(*, values: Iterable[Path] = (), sets: Iterable[str] = (), release: str = "nezha",
                namespace: str = "nezha") -> str:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for f in values:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    run = helm(*args, check=False)
    if run.returncode != 0:
        raise RenderError(run.stderr.strip())
    return run.stdout


def render(**kw: Any) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_text(**kw)) if d]


class RenderError(Exception):
    """helm refused the values; the message is helm's."""


def find(objects: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{len(hits)} {kind} objects named {name}: {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def pod_specs(objects: list[dict]) -> list[tuple[dict, dict]]:
    """(owner, pod spec) for every object that makes pods."""
    out = []
    for o in objects:
        spec = o.get("spec") or {}
        if o["kind"] in ("Deployment", "StatefulSet", "Job"):
            out.append((o, spec["template"]["spec"]))
        elif o["kind"] == "CronJob":
            out.append((o, spec["jobTemplate"]["spec"]["template"]["spec"]))
    return out
