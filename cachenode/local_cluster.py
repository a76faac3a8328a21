"""`nezha up`: a cache cluster of node processes on this machine.

Node i listens on 127.0.0.1:(base_port + i) with its own folder
DIR/node-i, and is named `node-i` in the ring. Membership is written to the
index, exactly as the controller writes it in a cluster, and each node learns
it from there. Without `--redis-url` the cluster gets an embedded index (a
local redis-server if one is installed, otherwise fakeredis over TCP).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from cachenode.index import Index, embedded_index
from nezha.config import Origin


@dataclass
class NodeProcess:
    id: str
    address: str
    data_dir: Path
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://{self.address}"


class LocalCluster:
    def __init__(self, *, nodes: int, origins: list[Origin], data_dir: Path, base_port: int = 8080,
                 replicas: int = 1, redis_url: str | None = None, log_level: str = "warning",
                 extra_args: tuple[str, ...] = ()) -> None:
        if nodes < 1:
            raise ValueError(f"nodes ({nodes}) must be at least 1")
        self.count = nodes
        self.origins = origins
        self.data_dir = Path(data_dir)
        self.base_port = base_port
        self.replicas = replicas
        self.redis_url = redis_url
        self.log_level = log_level
        self.extra_args = extra_args
        self.nodes: dict[str, NodeProcess] = {}
        self.token = secrets.token_hex(16)  # guards the nodes' internal endpoints
        self._stop_index = None
        self.index: Index | None = None

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.redis_url is None:
            self.redis_url, self._stop_index = await embedded_index(self.data_dir / "index")
        self.index = Index(redis_url=self.redis_url, node_id=None)
        await self.index.start()
        for i in range(self.count):
            self.spawn(f"node-{i}", self.base_port + i)
        await asyncio.gather(*(self.wait_ready(n) for n in self.nodes.values()))
        await self.publish()

    def spawn(self, node_id: str, port: int) -> NodeProcess:
        address = f"127.0.0.1:{port}"
        folder = self.data_dir / node_id
        args = [sys.executable, "-m", "nezha", "cache", "--listen", address, "--data-dir", str(folder),
                "--redis-url", self.redis_url, "--node-id", node_id, "--advertise", address,
                "--replicas", str(self.replicas), "--log-level", self.log_level, *self.extra_args]
        for o in self.origins:
            args += ["--origin", f"{o.host}={o.upstream}"]
        log = open(self.data_dir / f"{node_id}.log", "ab")
        # The token travels in the environment, not argv, where `ps` would show it.
        env = {**os.environ, "NEZHA_CLUSTER_TOKEN": self.token}
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        node = NodeProcess(node_id, address, folder, proc)
        self.nodes[node_id] = node
        return node

    async def wait_ready(self, node: NodeProcess, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"{node.id} exited with {node.proc.returncode}; "
                                       f"see {self.data_dir / (node.id + '.log')}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(node.url + "/healthz") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.05)
        raise RuntimeError(f"{node.id} at {node.address} not healthy within {timeout:g}s")

    def members(self) -> dict[str, str]:
        return {n.id: n.address for n in self.nodes.values() if n.proc.poll() is None}

    async def publish(self, members: dict[str, str] | None = None, *, timeout: float = 5.0) -> int:
        """Write the ring to the index and wait until every live node has adopted it."""
        assert self.index is not None
        epoch = await self.index.set_membership(members if members is not None else self.members())
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as s:
            for node in self.nodes.values():
                while node.proc.poll() is None:
                    with contextlib.suppress(aiohttp.ClientError, ValueError):
                        async with s.get(node.url + "/readyz") as r:
                            if (await r.json()).get("ring_epoch") == epoch:
                                break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{node.id} did not adopt ring epoch {epoch} within {timeout:g}s")
                    await asyncio.sleep(0.01)
        return epoch

    async def handoff(self, node_id: str, members: dict[str, str], timeout: float = 300.0) -> dict:
        """Have `node_id` copy what it holds to its owners under `members`; wait for it."""
        node = self.nodes[node_id]
        async with aiohttp.ClientSession() as s:
            auth = {"X-Nezha-Token": self.token}
            async with s.post(node.url + "/_nezha/handoff", json={"nodes": members}, headers=auth) as r:
                if r.status != 202:
                    raise RuntimeError(f"{node_id} refused hand-off: {r.status} {await r.text()}")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                async with s.get(node.url + "/_nezha/handoff", headers=auth) as r:
                    progress = await r.json()
                if progress["state"] == "done":
                    return progress
                await asyncio.sleep(0.1)
        raise RuntimeError(f"hand-off from {node_id} did not finish within {timeout:g}s")

    async def add(self, node_id: str, port: int) -> NodeProcess:
        """Start a node and move keys to it before it owns them, then publish the ring.

        Every existing node hands off to the ring that includes the newcomer,
        so its first requests are hits, not origin fetches.
        """
        node = self.spawn(node_id, port)
        await self.wait_ready(node)
        grown = {**self.members(), node_id: node.address}
        await asyncio.gather(*(self.handoff(other, grown) for other in self.members() if other != node_id))
        await self.publish(grown)
        return node

    async def remove(self, node_id: str) -> dict:
        """Drain a node to the ring without it, publish that ring, then stop it."""
        remaining = {k: v for k, v in self.members().items() if k != node_id}
        progress = await self.handoff(node_id, remaining)
        await self.publish(remaining)
        self.terminate(self.nodes[node_id])
        return progress

    @staticmethod
    def terminate(node: NodeProcess, *, sig: int = signal.SIGTERM) -> None:
        if node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.proc.pid, sig)
            try:
                node.proc.wait(10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(5)

    async def stop(self) -> None:
        for node in self.nodes.values():
            if node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes.values():
            try:
                await asyncio.get_running_loop().run_in_executor(None, node.proc.wait, 10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
        if self.index is not None:
            await self.index.close()
        if self._stop_index is not None:
            await self._stop_index()
