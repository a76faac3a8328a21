"""The chart's HA index (`redis.ha.enabled`), run from its own pod specs.

Three pods of the rendered StatefulSet, each its Redis and its Sentinel
container as the chart writes them (the shell that finds the master, the
Sentinel file it writes), on loopback addresses standing in for pod IPs, in
mount namespaces whose /etc/hosts is the headless Service's DNS. Then the
master is killed: a quorum of Sentinels promotes a replica, the killed pod
comes back as a replica of it (never a second master), and `nezha stats`
reads the index through the URL the chart gives the nodes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as aredis

from testkit.tools import require_tool
from testkit.waits import wait_for_value
from tests.integration.chart.render import CHART, find, render
from tests.integration.system.conftest import need_root
from tests.integration.system.podspec import container_argv, resolve_env
from tests.pod_command import cover_for_hosts

NS = "nezha"
PASSWORD = "h4indexpw"
ROOT = Path(__file__).resolve().parents[3]
IPS = ["127.0.0.41", "127.0.0.42", "127.0.0.43"]


class Pod:
    """One pod of the StatefulSet: its two containers as processes."""

    def __init__(self, index: int, template: dict, root: Path, hosts: Path) -> None:
        self.name = f"nezha-redis-{index}"
        self.ip = IPS[index]
        self.template = template
        self.root = root / self.name
        self.hosts = hosts
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def start(self, container_name: str) -> None:
        pod = {"metadata": {"name": self.name, "namespace": NS, "uid": self.name},
               "status": {"podIP": self.ip}, "spec": self.template["spec"]}
        (container,) = [c for c in self.template["spec"]["containers"] if c["name"] == container_name]
        env = resolve_env(pod, container, secret=lambda name: {"data": {"password": base64.b64encode(
            PASSWORD.encode()).decode()}} if name == "nezha-redis" else None, configmap=lambda name: None)
        argv = container_argv(container, env, {}, entrypoints={})
        volumes = {}
        for mount in container.get("volumeMounts") or []:
            where = self.root / "volumes" / mount["name"]
            where.mkdir(parents=True, exist_ok=True)
            volumes[mount["mountPath"]] = where
        # What a container runtime would mount: the script's paths under a mountPath, here.
        script = argv[-1]
        for path, where in sorted(volumes.items(), key=lambda kv: -len(kv[0])):
            script = re.sub(rf"(?<=\s){re.escape(path)}(?=[/\s])", str(where), script)
        argv = [*argv[:-1], script]
        log = self.root / f"{container_name}.log"
        self.logs[container_name] = log
        wrap = 'mount --bind "$NEZHA_TEST_HOSTS" /etc/hosts && unset NEZHA_TEST_HOSTS && exec "$@"'
        with open(log, "ab") as out:
            self.procs[container_name] = subprocess.Popen(
                [require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c", wrap, "sh", *argv],
                env={"PATH": os.environ["PATH"], **env, "NEZHA_TEST_HOSTS": str(self.hosts)},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, container_name: str) -> None:
        proc = self.procs.pop(container_name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)


async def role(ip: str) -> list | None:
    client = aredis.Redis(host=ip, port=6379, password=PASSWORD, decode_responses=True)
    try:
        return await client.execute_command("ROLE")
    except (OSError, aredis.RedisError):
        return None
    finally:
        await client.aclose()


@pytest.fixture
def pods(tmp_path, request):
    need_root()
    cover_for_hosts(request)  # the pods' /etc/hosts is bound over the machine's, which a bare root lacks
    for tool in ("unshare", "redis-server", "redis-cli", "helm"):
        require_tool(tool)
    objects = render(values=[CHART / "ci" / "redis-ha-values.yaml"], sets=["redis.ha.downAfterSeconds=1",
                                                                           "redis.ha.failoverTimeoutSeconds=5"])
    template = find(objects, "StatefulSet", "nezha-redis")["spec"]["template"]
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n" + "".join(
        f"{ip}\tnezha-redis-{i}.nezha-redis-headless.{NS}.svc\n" for i, ip in enumerate(IPS)))
    made = [Pod(i, template, tmp_path, hosts) for i in range(3)]
    yield made, objects
    for pod in made:
        pod.stop()


async def test_the_charts_ha_index_fails_over_and_the_killed_master_returns_as_a_replica(pods):
    pods, objects = pods
    for pod in pods:
        pod.start("redis")
        pod.start("sentinel")

    names = [f"nezha-redis-{i}.nezha-redis-headless.{NS}.svc" for i in range(len(pods))]

    async def sentinels_agree(*, replicas_up: bool = True) -> int | None:
        """The pod every running Sentinel names as the master, if they all agree."""
        agreed = set()
        for pod in pods:
            if "sentinel" not in pod.procs:
                continue
            client = aredis.Redis(host=pod.ip, port=26379, password=PASSWORD, decode_responses=True)
            try:
                addr = await client.execute_command("SENTINEL", "get-master-addr-by-name", "nezha")
                others = await client.execute_command("SENTINEL", "sentinels", "nezha")
                replicas = await client.execute_command("SENTINEL", "replicas", "nezha")
            except (OSError, aredis.RedisError):
                return None
            finally:
                await client.aclose()
            if not addr or addr[0] not in names or len(others) < 2:
                return None
            # A Sentinel promotes only a replica whose last INFO said its link
            # was up: one that still remembers the first sync would be refused
            # (-failover-abort-no-good-slave), and so would every retry for a while.
            if replicas_up and (len(replicas) != 2 or any(
                    r["flags"] != "slave" or r["master-link-status"] != "ok" for r in replicas)):
                return None
            agreed.add(names.index(addr[0]))
        return agreed.pop() if len(agreed) == 1 else None

    async def settled(master: int) -> bool:
        """One master, which the others replicate with their links up."""
        roles = [await role(p.ip) for p in pods]
        if any(r is None for r in roles) or roles[master][0] != "master":
            return False
        replicas = [r for i, r in enumerate(roles) if i != master]
        return all(r[0] == "slave" and r[1] == names[master] and r[3] == "connected" for r in replicas)

    async def one_master() -> int | None:
        """The master the Sentinels agree on, once the pods say the same.

        Not a fixed pod: with down-after at one second, a loaded machine can
        make a master miss its pings, and the Sentinels then rightly fail it
        over again. What must hold is that there is one master, named alike
        by every Sentinel, and that every other pod replicates it."""
        master = await sentinels_agree()
        return master if master is not None and await settled(master) else None

    try:
        killed = await wait_for_value(one_master, timeout=30)

        pods[killed].kill("redis")  # the master's container dies; its Sentinel stays, as in a pod

        async def promoted() -> int | None:
            master = await sentinels_agree(replicas_up=False)
            if master is None or master == killed:
                return None
            r = await role(pods[master].ip)
            return master if r is not None and r[0] == "master" else None

        await wait_for_value(promoted, timeout=30)
        # The kubelet restarts the container: it asks the Sentinels and comes back
        # as a replica. Its very first answer says so: never a second master, even
        # for a moment.
        pods[killed].start("redis")
        first = await wait_for_value(lambda: role(pods[killed].ip), timeout=30)
        assert first[0] == "slave", first
        await wait_for_value(one_master, timeout=30)

        # The URL the chart gives the nodes and the controller finds the new master.
        cache = find(objects, "StatefulSet", "nezha-cache")["spec"]["template"]["spec"]["containers"][0]
        url = next(e["value"] for e in cache["env"] if e["name"] == "NEZHA_REDIS_URL").replace(
            "$(REDIS_PASSWORD)", PASSWORD)
        assert url.startswith("redis+sentinel://")
        wrap = 'mount --bind "$NEZHA_TEST_HOSTS" /etc/hosts && unset NEZHA_TEST_HOSTS && exec "$@"'
        stats = await asyncio.to_thread(subprocess.run, [
            require_tool("unshare"), "--mount", "--propagation", "private", "sh", "-c", wrap, "sh",
            sys.executable, "-m", "nezha", "stats", "--json", "--redis-url", url],
            env={**os.environ, "NEZHA_TEST_HOSTS": str(pods[0].hosts)}, capture_output=True, text=True,
            timeout=60, cwd=ROOT)
        assert stats.returncode == 0, stats.stdout + stats.stderr
        assert "cluster" in json.loads(stats.stdout)
        assert PASSWORD not in stats.stdout + stats.stderr
    except AssertionError:
        for pod in pods:
            client = aredis.Redis(host=pod.ip, port=26379, password=PASSWORD, decode_responses=True)
            try:
                print(pod.name, "sentinel replicas:", await client.execute_command("SENTINEL", "replicas", "nezha"))
            except (OSError, aredis.RedisError) as e:
                print(pod.name, "sentinel:", e)
            finally:
                await client.aclose()
        for pod in pods:
            for name, log in pod.logs.items():
                print(f"--- {pod.name}/{name}\n{log.read_text()[-3000:]}")
        raise
