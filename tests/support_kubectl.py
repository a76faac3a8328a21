"""The real kubectl against the API double, for tests that make workloads as a user does.

Run as a subprocess without blocking the event loop the double answers on.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import yaml

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.tools import require_tool


class Kubectl:
    def __init__(self, api_url: str, tmp_path: Path, ns: str) -> None:
        self.binary = require_tool("kubectl")
        self.config = kubeconfig(tmp_path / "kubeconfig", api_url)
        self.ns = ns
        self.tmp = tmp_path

    async def __call__(self, *argv: str) -> str:
        proc = await asyncio.create_subprocess_exec(self.binary, "--kubeconfig", str(self.config), "-n", self.ns,
                                                    *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, f"kubectl {' '.join(argv)}: {err.decode()}"
        return out.decode()

    async def create(self, *objects: dict) -> str:
        path = self.tmp / f"objects-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump_all(objects))
        # The double serves no OpenAPI documents (as in tests/integration/chart/test_chart.py).
        return await self("create", "--validate=false", "-f", str(path))

    async def prefetched(self, resource: str, name: str, timeout: float = 15.0) -> dict:
        """The workload's prefetch-status once its PrefetchDone Event exists (read with kubectl)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = json.loads(await self("get", "events", "-o", "json"))["items"]
            if any(e["reason"] == "PrefetchDone" and e["involvedObject"]["name"] == name for e in events):
                obj = json.loads(await self("get", resource, name, "-o", "json"))
                return json.loads(obj["metadata"]["annotations"]["nezha.io/prefetch-status"])
            await asyncio.sleep(0.1)
        raise AssertionError(f"no PrefetchDone for {resource}/{name} within {timeout} s")
