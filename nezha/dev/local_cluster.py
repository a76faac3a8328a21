"""`nezha up`: a cache cluster of node processes on this machine.

Node i listens on 127.0.0.1:(base_port + i) with its own folder
DIR/node-i, and is named `node-i` in the ring. Membership is written to the
index, exactly as the controller writes it in a cluster, and each node learns
it from there. Without `--redis-url` the cluster gets an embedded index (a
local redis-server if one is installed, otherwise fakeredis over TCP).

Growing and shrinking follow the same order as the controller: `add` hands
keys to the newcomer before it owns them; `remove` drains the leaving node
to the ring without it, and publishes that ring and stops the node only when
every object reached its new owners (it retries, then refuses with
`DrainFailed` naming the objects, leaving the node serving and in the ring).
`nezha up` runs a fixed set of nodes and never removes one while running;
programs that do (tests, benchmarks) go through these two methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from nezha.index.handle import Index
from nezha.index.embedded import embedded_index
from nezha.config import DEFAULT_CLUSTER_REPLICAS, Origin
from nezha.errors import ConfigError, NezhaError
from nezha.folder_lock import hold
from nezha.localproc import die_with_parent
from nezha.wire import HANDOFF_PATH, TOKEN_HEADER


class DrainFailed(NezhaError):
    """A node's objects did not all reach their new owners; it was not removed."""

    def __init__(self, node_id: str, progress: dict, attempts: int) -> None:
        self.node_id = node_id
        self.progress = progress
        errors = progress.get("errors") or []
        more = (progress.get("failed") or 0) - len(errors)
        shown = "; ".join(errors) + (f"; and {more} more" if more > 0 else "")
        super().__init__(
            f"drain of {node_id} failed for {progress.get('failed')} of {progress.get('total')} object copies "
            f"after {attempts} attempt(s); {node_id} keeps serving and stays in the ring: {shown}")


class NodeFailed(NezhaError):
    """A node process that did not come up, or died; the message is its own last words."""


class RingTaken(NezhaError):
    """The index already holds a ring this cluster did not write."""


def last_words(log: Path) -> str:
    """The last line a node wrote when it is an error (its one-line refusal on
    stderr, a traceback's last line, an event of level error or critical),
    shortened; else that line, labelled as the last one. A node killed (-9)
    logs nothing about it, and its last ordinary line (a request, a ring
    update) read as if it were the cause."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    if not lines:
        return "(nothing logged)"
    last = lines[-1]
    if not _is_error(last):
        return f"no error logged; its last line: {last[:300]}"
    return last[:300]


def _is_error(line: str) -> bool:
    """A line of the node's log that says what went wrong: any line that is not
    a JSON event (stderr: `nezha cache: ...`, a traceback), or an event of
    level error or critical."""
    if not line.startswith("{"):
        return True
    try:
        event = json.loads(line)
    except ValueError:
        return True
    return not isinstance(event, dict) or event.get("level") in ("error", "critical") or "exception" in event


def port_overlap(nodes: int, base_port: int, tls_base_port: int | None) -> str | None:
    """Why node ports from `base_port` and TLS ports from `tls_base_port`, `nodes`
    of each, cannot all be bound (one port named twice); None when they can.
    Checked before anything starts: otherwise a node fails on a port its own
    cluster took, and the error names that node's --listen."""
    if tls_base_port is None:
        return None
    port = max(base_port, tls_base_port)
    if port > min(base_port, tls_base_port) + nodes - 1:
        return None
    return (f"--base-port {base_port} and --tls-base-port {tls_base_port} overlap: with {nodes} node(s), "
            f"node-{port - base_port} would listen on {port} and node-{port - tls_base_port} answer TLS on it; "
            f"give the ranges {nodes} ports apart (e.g. --tls-base-port {base_port + nodes})")


@dataclass
class NodeProcess:
    id: str
    address: str
    data_dir: Path
    proc: subprocess.Popen
    tls_address: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}"


class LocalCluster:
    def __init__(self, *, nodes: int, origins: list[Origin], data_dir: Path, base_port: int = 8080,
                 replicas: int | None = 1, redis_url: str | None = None, log_level: str = "warning",
                 extra_args: tuple[str, ...] = (), leave_settle: float = 0.0,
                 node_settings: dict[str, Any] | None = None, tls_base_port: int | None = None,
                 token: str | None = None) -> None:
        """`replicas` None means the cluster default: min(2, nodes).

        `leave_settle` is how long a node given SIGTERM while in the ring waits
        for a ring without it (cachenode/node.py `leave`). 0 here: a local
        cluster changes its ring before it stops a node (`remove`), and never
        otherwise, so waiting would only slow every stop down.

        `node_settings`: more settings for every node, as --config keys
        (`UpSettings.node_settings()`); with `origins`, the log level and
        `leave_settle` they go into DIR/node-settings.yaml, which every node
        reads. Nodes get no NEZHA_* variable of this process: what they take
        from the environment was read here, once, into those settings.
        `tls_base_port`: node i also answers TLS on 127.0.0.1:tls_base_port+i.
        `token`: the cluster token (default: a new random one per cluster).
        """
        if nodes < 1:
            raise ValueError(f"nodes ({nodes}) must be at least 1")
        if replicas is None:
            replicas = min(DEFAULT_CLUSTER_REPLICAS, nodes)
        if replicas < 1:
            raise ValueError(f"replicas ({replicas}) must be at least 1")
        if (overlap := port_overlap(nodes, base_port, tls_base_port)) is not None:
            raise ConfigError(overlap)
        self.count = nodes
        self.origins = origins
        self.data_dir = Path(data_dir)
        self.base_port = base_port
        self.replicas = replicas
        self.redis_url = redis_url
        self.log_level = log_level
        self.extra_args = extra_args
        self.leave_settle = leave_settle
        self.node_settings = dict(node_settings or {})
        self.tls_base_port = tls_base_port
        self.nodes: dict[str, NodeProcess] = {}
        self.token = token or secrets.token_hex(16)  # guards the nodes' internal endpoints
        self.written: dict[str, str] | None = None  # the ring this cluster last wrote
        self._stop_index = None
        self.index: Index | None = None
        self._lock: int | None = None  # the descriptor holding DIR's lock while the cluster runs

    async def start(self, *, force: bool = False) -> None:
        """Start the nodes, wait for each (its own process answering), publish their ring.

        An index given by URL may hold someone else's ring: replaced only
        with `force` (RingTaken otherwise). A node that does not come up is
        NodeFailed with its own last line; the others are stopped then.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._lock is None:
            # Its node folders, index and settings file are this cluster's alone (nezha/folder_lock.py).
            self._lock = hold(self.data_dir, command="nezha up")
        own_index = self.redis_url is None
        if own_index:
            self.redis_url, self._stop_index = await embedded_index(self.data_dir / "index")
        self.index = Index(redis_url=self.redis_url, node_id=None)
        await self.index.start()
        if not own_index and not force:
            held = await self.index.get_membership()
            if held is not None and held.nodes:
                raise RingTaken(f"the index already holds a ring (epoch {held.epoch}: {', '.join(sorted(held.nodes))}); "
                                "pass --force to replace it")
        self.write_node_settings()
        for i in range(self.count):
            tls = None if self.tls_base_port is None else self.tls_base_port + i
            self.spawn(f"node-{i}", self.base_port + i, tls_port=tls)
        try:
            await asyncio.gather(*(self.wait_ready(n) for n in self.nodes.values()))
        except NodeFailed:
            await self.stop(keep_ring=True)
            raise
        await self.publish()
        self.written = dict(self.members())

    @property
    def settings_file(self) -> Path:
        return self.data_dir / "node-settings.yaml"

    def write_node_settings(self) -> None:
        """The settings every node shares, as the --config file each one reads."""
        # One process per node unless asked: the nodes share this machine's cores (UpSettings.workers).
        shared = {"workers": 1, **self.node_settings, "log_level": self.log_level, "leave_settle": self.leave_settle,
                  "origins": [o.model_dump(mode="json", exclude_defaults=True) for o in self.origins]}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.settings_file.write_text("# Written by nezha up for its nodes, each run: edits are lost.\n"
                                      + yaml.safe_dump(shared, sort_keys=True))

    def spawn(self, node_id: str, port: int, *, tls_port: int | None = None) -> NodeProcess:
        address = f"127.0.0.1:{port}"
        folder = self.data_dir / node_id
        if not self.settings_file.exists():
            self.write_node_settings()
        args = [sys.executable, "-m", "nezha", "cache", "--config", str(self.settings_file), "--listen", address,
                "--data-dir", str(folder), "--redis-url", self.redis_url, "--node-id", node_id,
                "--advertise", address, "--replicas", str(self.replicas), *self.extra_args]
        if tls_port is not None:
            args += ["--tls-listen", f"127.0.0.1:{tls_port}"]
        log = open(self.data_dir / f"{node_id}.log", "ab")
        # The token travels in the environment, not argv, where `ps` would show it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_") or k.startswith("NEZHA_TEST_")}
        env["NEZHA_CLUSTER_TOKEN"] = self.token
        # A session of its own: the terminal's Ctrl-C or hang-up reaches only the command that
        # started the node, which stops the cluster in order. die_with_parent: the node gets
        # SIGTERM when that command dies, however it dies (SIGKILL too), so none serves on alone.
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                preexec_fn=die_with_parent())
        log.close()
        node = NodeProcess(node_id, address, folder, proc,
                           tls_address=None if tls_port is None else f"127.0.0.1:{tls_port}")
        self.nodes[node_id] = node
        return node

    def log_of(self, node: NodeProcess) -> Path:
        return self.data_dir / f"{node.id}.log"

    async def wait_ready(self, node: NodeProcess, timeout: float = 20.0) -> None:
        """Until the node's own process answers on its address (its pid in /readyz): whatever
        else may hold the port does not count."""
        deadline = time.monotonic() + timeout
        seen = None
        # Short per-probe timeouts: a port held by something that accepts and never answers must not hang us.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as s:
            while time.monotonic() < deadline:
                if node.proc.poll() is not None:
                    raise NodeFailed(f"{node.id} exited with code {node.proc.returncode}: "
                                     f"{last_words(self.log_of(node))}")
                with contextlib.suppress(aiohttp.ClientError, ValueError, asyncio.TimeoutError):
                    async with s.get(node.url + "/readyz") as r:
                        detail = await r.json()
                        seen = detail.get("pid")
                        # With --workers, the primary answers: its supervisor is the node's process.
                        if node.proc.pid in (seen, detail.get("supervisor")):
                            return
                await asyncio.sleep(0.05)
        other = f"; {node.address} is answered by pid {seen}, not the node" if seen else ""
        raise NodeFailed(f"{node.id} (pid {node.proc.pid}) not answering on {node.address} within {timeout:g}s"
                         f"{other}: {last_words(self.log_of(node))}")

    async def watch(self, on_death, *, interval: float = 0.5) -> None:
        """Until cancelled: a node that exits is reported (`on_death(node, epoch)`) and taken out of the ring."""
        reported: set[str] = set()
        while True:
            await asyncio.sleep(interval)
            dead = [n for n in self.nodes.values() if n.proc.poll() is not None and n.id not in reported]
            if not dead:
                continue
            reported.update(n.id for n in dead)
            epoch = None
            with contextlib.suppress(NezhaError):
                epoch = await self.publish(self.members())
                self.written = dict(self.members())
            for node in dead:
                on_death(node, epoch)

    def members(self) -> dict[str, str]:
        return {n.id: n.address for n in self.nodes.values() if n.proc.poll() is None}

    async def publish(self, members: dict[str, str] | None = None, *, timeout: float = 5.0,
                      leaving: set[str] | None = None) -> int:
        """Write the ring to the index and wait until every live node has adopted it.

        `leaving` names nodes taken out for good, as the controller does on a
        scale-down: they hand their objects off when they get SIGTERM.
        """
        assert self.index is not None
        epoch = await self.index.set_membership(members if members is not None else self.members(),
                                                leaving=leaving or set())
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

    async def handoff(self, node_id: str, members: dict[str, str], *, stall_timeout: float = 60.0) -> dict:
        """Have `node_id` copy what it holds to its owners under `members`; wait for it.

        No bound on the whole: copying a large data set takes what it takes.
        The hand-off fails only when its progress (objects done, bytes moved)
        stands still for `stall_timeout`.
        """
        node = self.nodes[node_id]
        async with aiohttp.ClientSession() as s:
            auth = {TOKEN_HEADER: self.token}
            async with s.post(node.url + HANDOFF_PATH, json={"nodes": members}, headers=auth) as r:
                if r.status != 202:
                    raise RuntimeError(f"{node_id} refused hand-off: {r.status} {await r.text()}")
            progress: dict = {}
            moved, last = None, time.monotonic()
            while time.monotonic() - last < stall_timeout:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"{node_id} exited with {node.proc.returncode} during its hand-off")
                async with s.get(node.url + HANDOFF_PATH, headers=auth) as r:
                    progress = await r.json()
                if progress["state"] == "done":
                    return progress
                if (progress["done"], progress.get("bytes")) != moved:
                    moved, last = (progress["done"], progress.get("bytes")), time.monotonic()
                await asyncio.sleep(0.1)
        raise RuntimeError(f"hand-off from {node_id} made no progress for {stall_timeout:g}s: {progress}")

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

    async def remove(self, node_id: str, *, attempts: int = 3) -> dict:
        """Drain a node to the ring without it, publish that ring, then stop it.

        A drain that reports failed copies is run again (objects already
        copied are only checked); if copies still fail after `attempts`,
        raises DrainFailed and leaves the node serving and in the ring, so no
        object is lost.
        """
        remaining = {k: v for k, v in self.members().items() if k != node_id}
        if not remaining:
            raise ValueError(f"{node_id} is the last node; there is nothing to drain it to")
        for attempt in range(1, attempts + 1):
            progress = await self.handoff(node_id, remaining)
            if progress["failed"] == 0:
                break
            if attempt < attempts:
                await asyncio.sleep(0.5 * attempt)
        else:
            raise DrainFailed(node_id, progress, attempts)
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

    async def stop(self, *, keep_ring: bool = True) -> None:
        """Stop every node; unless `keep_ring`, remove the ring this cluster wrote (if nobody replaced it)."""
        if not keep_ring and self.index is not None and self.written is not None:
            with contextlib.suppress(NezhaError):
                await self.index.clear_membership(if_nodes=self.written)
            self.written = None
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
            self.index = None
        if self._stop_index is not None:
            stop_index, self._stop_index = self._stop_index, None
            await stop_index()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
