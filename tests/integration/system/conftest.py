"""The whole system from the chart's own pod specs: fixtures."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.kubeapi.server import KubeAPI
from testkit.tools import require_tool, unavailable
from tests.integration.chart.render import CHART
from tests.integration.system.minicluster import MiniCluster
from tests.pod_command import cover_for_hosts
from tests.support_origin import TestOrigin

NS = "nezha"


def need_root() -> None:
    if os.geteuid() != 0:
        unavailable("the whole-system test needs root: Services listen on ports 80 and 443 and pods get mount "
                    "namespaces")


class System:
    """The installed chart: the double, the stand-ins, the origin, and the commands users type."""

    def __init__(self, *, api: KubeAPI, mini: MiniCluster, origin: TestOrigin | None, origin_url: str, root: Path,
                 kubeconfig: Path) -> None:
        self.api, self.mini, self.origin, self.origin_url = api, mini, origin, origin_url
        self.root, self.kubeconfig = root, kubeconfig
        self.helm = [require_tool("helm"), "--kubeconfig", str(kubeconfig)]
        self.kubectl = [require_tool("kubectl"), "--kubeconfig", str(kubeconfig)]

    async def run(self, *argv: str, env: dict | None = None, timeout: float = 120) -> str:
        """A command line, awaited: the double answering it runs on this event loop."""
        proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    env={**os.environ, **(env or {})})
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"{' '.join(argv[:4])}... did not finish in {timeout} s")
        assert proc.returncode == 0, f"{' '.join(argv[:4])}... exited {proc.returncode}: {out.decode()}{err.decode()}"
        return out.decode()

    def obj(self, group: str, plural: str, name: str, ns: str | None = NS) -> dict | None:
        return self.api.objects_of(group, plural).get((ns, name))

    def service_ip(self, name: str) -> str:
        return self.obj("", "services", name)["spec"]["clusterIP"]

    def redis_password(self) -> str:
        return base64.b64decode(self.obj("", "secrets", "nezha-redis")["data"]["password"]).decode()

    def redis_url(self) -> str:
        return f"redis://:{self.redis_password()}@{self.service_ip('nezha-redis')}:6379/0"


@pytest.fixture
async def system(tmp_path, request):
    async for installed in installed_system(tmp_path, request):
        yield installed


@pytest.fixture
async def https_system(tmp_path, request):
    """The chart with https.terminate: TLS clients' requests fetched from the same plain local origin."""
    async for installed in installed_system(tmp_path, request, https=True):
        yield installed


@pytest.fixture
async def named_origin_system(tmp_path, request):
    """The chart with the origin's upstream named by its own host name, as the chart's default origins are
    (`upstream: http://www.cs.toronto.edu`): the world's DNS (the minicluster's public_hosts) answers it."""
    async for installed in installed_system(tmp_path, request, named_origin=True):
        yield installed


async def installed_system(tmp_path, request, *, https: bool = False, named_origin: bool = False):
    origin = TestOrigin()
    from aiohttp import web
    runner = web.AppRunner(origin.app(), access_log=None)
    await runner.setup()
    # Not 127.0.0.1: in a pod of several containers that is the pod's own loopback (minicluster.py).
    site = web.TCPSite(runner, "127.0.0.5", 0)
    await site.start()
    origin_url = f"http://127.0.0.5:{site._server.sockets[0].getsockname()[1]}"

    public_hosts = {}
    upstream = origin_url
    if named_origin:
        public_hosts["www.cs.toronto.edu"] = "127.0.0.5"
        upstream = origin_url.replace("127.0.0.5", "www.cs.toronto.edu")
    entry = {"host": "www.cs.toronto.edu", "upstream": upstream}
    values = {
        "image": {"repository": "nezha", "tag": "test"},
        "origins": [{**entry, "tlsUpstream": origin_url} if https else entry],
        "cache": {"replicas": 3, "terminationGracePeriodSeconds": 30},
        **({"https": {"terminate": True}} if https else {}),
    }
    try:
        async for sys_ in installed_chart(tmp_path, request, values, public_hosts=public_hosts, origin=origin,
                                          origin_url=origin_url):
            yield sys_
    finally:
        await runner.cleanup()


async def installed_chart(tmp_path, request, values: dict, *, public_hosts: dict[str, str] | None = None,
                          origin: TestOrigin | None = None, origin_url: str = ""):
    """`helm install` of the chart with `values` into the API double, its pods run by the minicluster;
    `public_hosts` are the names the world's DNS answers (a dataset host's stand-in)."""
    need_root()
    for tool in ("helm", "kubectl", "unshare", "redis-server", "redis-cli", "wget"):
        require_tool(tool)
    hosts = cover_for_hosts(request)
    assert "www.cs.toronto.edu" not in hosts.read_text()  # else hostAliases would prove nothing

    api = KubeAPI(bookmark_interval=0.2)
    api.service_network = "127.1"
    await api.start()
    config = kubeconfig(tmp_path / "kubeconfig", api.url)
    mini = MiniCluster(api=api, namespace=NS, root=tmp_path / "cluster", kubeconfig=config,
                       entrypoints={"nezha": [str(Path(sys.executable).with_name("nezha"))],
                                    "python": [sys.executable],  # the image's Python (exec probes)
                                    "redis": ["redis-server"], "redis-server": [require_tool("redis-server")]})
    mini.public_hosts.update(public_hosts or {})
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    sys_ = System(api=api, mini=mini, origin=origin, origin_url=origin_url, root=tmp_path, kubeconfig=config)
    try:
        await sys_.run(*sys_.kubectl, "create", "namespace", NS)
        await sys_.run(*sys_.kubectl, "create", "namespace", "ml")
        # The double serves no OpenAPI documents; test_chart.py checks the schemas.
        await sys_.run(*sys_.helm, "install", "nezha", str(CHART), "-n", NS, "-f", str(values_file),
                 "--disable-openapi-validation")
        await mini.start()
        yield sys_
        assert not mini.problems, f"the stand-ins hit problems: {mini.problems}"
    finally:
        await mini.stop()
        await api.stop()
