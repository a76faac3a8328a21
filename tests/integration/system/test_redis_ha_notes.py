"""The Redis HA check `helm install` prints, run in the chart's own Sentinel container.

The notes of `ci/redis-ha-values.yaml` say the index is healthy when a
command run in a Sentinel container prints `status=ok` with every replica
and every Sentinel counted. Here the three pods of the rendered StatefulSet
run as in tests/integration/system/test_redis_ha.py, and the printed
command's shell line runs with the environment its container has (`kubectl
exec` stands for nothing more), until it prints what the notes promise.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import subprocess

from testkit.tools import require_tool
from testkit.waits import wait_for_value
from tests.integration.chart.render import CHART
from tests.integration.chart.test_chart_notes import notes
from tests.integration.system.podspec import resolve_env
from tests.integration.system.test_redis_ha import NS, PASSWORD, pods  # noqa: F401  (fixture)


def container_env(pod, container_name: str) -> dict[str, str]:
    """What `kubectl exec -c <container_name>` into `pod` has in its environment."""
    spec = {"metadata": {"name": pod.name, "namespace": NS, "uid": pod.name}, "status": {"podIP": pod.ip},
            "spec": pod.template["spec"]}
    (container,) = [c for c in pod.template["spec"]["containers"] if c["name"] == container_name]
    return resolve_env(spec, container, secret=lambda name: {"data": {"password": base64.b64encode(
        PASSWORD.encode()).decode()}} if name == "nezha-redis" else None, configmap=lambda name: None)


async def test_the_printed_sentinel_check_shows_every_replica_and_sentinel_once_the_index_settles(pods):  # noqa: F811
    made, _ = pods
    printed = " ".join(re.sub(r"\\\n\s*", "", notes("-f", str(CHART / "ci" / "redis-ha-values.yaml"))).split())
    line = re.search(r"kubectl -n nezha exec statefulset/nezha-redis -c (\S+) -- sh -c '([^']+)' \| grep (\S+)",
                     printed)
    assert line, printed
    container, script, wanted = line.groups()
    expected = re.search(r"this prints status=ok,\.\.\.,(slaves=\d+,sentinels=\d+):", printed).group(1)
    assert expected == f"slaves={len(made) - 1},sentinels={len(made)}"
    for pod in made:
        pod.start("redis")
        pod.start("sentinel")
    env = {"PATH": os.environ["PATH"], **container_env(made[0], container)}
    sh = require_tool("sh")

    async def healthy() -> str | None:
        proc = await asyncio.create_subprocess_exec(sh, "-c", f"{script} | grep {wanted}", env=env,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, _ = await proc.communicate()
        text = out.decode().strip()
        return text if "status=ok" in text and text.endswith(expected) else None

    first = await healthy()
    assert first is None  # a check that passes before the Sentinels know each other would prove nothing
    shown = await wait_for_value(healthy, timeout=60)
    assert re.fullmatch(rf"master0:name=nezha,status=ok,address=[^,]+:6379,{expected}", shown), shown
