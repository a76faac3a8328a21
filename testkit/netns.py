"""A network with real links on this machine: one network namespace per host, each behind a rate-limited link.

Loopback has no network card to saturate, so a fan-out measured over it
says nothing about links. Here every host (a cache node, the origin, Redis,
a group of clients) gets a namespace of its own with one interface, `eth0`,
joined by a veth pair to a bridge that lives in a namespace of its own
(`<tag>-br`). Each link is shaped by `tc` with a token bucket (tbf) in both
directions: on `eth0` for what the host sends, on the bridge's end of the
pair for what it receives, at `rate` bytes/s with a stated burst and
latency (the longest a packet may queue before the bucket drops it).
There is no delay on a link: this machine's kernel has no `netem`
(CONFIG_NET_SCH_NETEM is not set); testkit/delayline.py puts a distance
in front of a server instead.

Nothing touches the host's own network: addresses exist only inside the
namespaces made here (one /24, the hosts' link route and no other: no
default route, so nothing inside can reach out), and the bridge is not
the host's. Everything is deleted on exit from the `with` block, also
when the set-up itself fails half-way, on Ctrl-C (KeyboardInterrupt
unwinds the block) and on any error. A run killed outright (SIGKILL)
leaves its namespaces behind; their names carry the run's pid, and the
next `Network` deletes those of runs that are no longer alive.

Namespaces need root and iproute2 (`ip`, `tc`); without them `Network`
refuses to start with `NetnsUnavailable`, one line naming what is missing.
Processes run inside a host with `net.argv(host, *argv)` (`ip netns exec`),
or the calling thread steps into a host's namespace with `net.inside(host)`:
what it starts and the sockets it opens there are that host's.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

SUBNET = "10.77.0"  # inside the namespaces only; two runs never share a bridge
CLONE_NEWNET = 0x40000000  # <linux/sched.h>: setns(2) into a network namespace
_OURS = re.compile(r"^nz(\d+)x[0-9a-f]{4}-")


class NetnsUnavailable(Exception):
    """Network namespaces cannot be made here: not root, or no iproute2."""


class NetnsError(Exception):
    """A step of building the network failed; the message names the command and its error."""


@dataclass(frozen=True)
class Host:
    """One machine of the simulated network and its link: `rate` bytes/s each way (0: unlimited)."""

    name: str
    rate: int = 0


@dataclass
class Network:
    """The namespaces, bridge and shaped links for `hosts`; a context manager that builds and deletes them.

    `burst` (bytes) is the token bucket's depth and `latency` (seconds) the
    longest a packet waits in its queue: together with `rate` they are the
    link as `tc` states it. `before_step` is called with each command before
    it runs (a test raises from it to fail the set-up half-way).
    """

    hosts: list[Host]
    burst: int = 64 * 1024
    latency: float = 0.05
    before_step: Callable[[list[str]], None] | None = None
    tag: str = field(default_factory=lambda: f"nz{os.getpid()}x{secrets.token_hex(2)}")
    built: bool = False

    def __post_init__(self) -> None:
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"host names repeat: {names}")
        if not 0 < len(names) < 250:
            raise ValueError(f"{len(names)} hosts: one /24 holds 1 to 249")
        bad = [n for n in names if not re.fullmatch(r"[a-z0-9]{1,20}", n)]
        if bad:
            raise ValueError(f"host names must be 1-20 of [a-z0-9]: {bad}")
        self._made: list[str] = []  # namespaces, in the order they were made

    # -- naming ----------------------------------------------------------------------
    @property
    def bridge_ns(self) -> str:
        return f"{self.tag}-br"

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        """`host`'s IPv4 address on the bridge."""
        return f"{SUBNET}.{self._index(host) + 2}"

    def argv(self, host: str, *argv: str) -> list[str]:
        """`argv` run inside `host`'s namespace."""
        self._index(host)
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def _index(self, host: str) -> int:
        for i, h in enumerate(self.hosts):
            if h.name == host:
                return i
        raise KeyError(f"no host {host!r} in this network ({', '.join(h.name for h in self.hosts)})")

    # -- building and deleting ---------------------------------------------------------
    def __enter__(self) -> "Network":
        self.build()
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def build(self) -> None:
        """Make every namespace, link and queue; on any failure delete what was made and raise."""
        check_available()
        sweep_dead_runs()
        try:
            self._add_namespace(self.bridge_ns)
            self._run("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            self._run("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
            for i, host in enumerate(self.hosts):
                self._add_host(i, host)
        except BaseException:
            self.delete()
            raise
        self.built = True

    def _add_namespace(self, name: str) -> None:
        self._run("ip", "netns", "add", name)
        self._made.append(name)
        self._run("ip", "-n", name, "link", "set", "lo", "up")

    def _add_host(self, i: int, host: Host) -> None:
        ns, port = self.namespace(host.name), f"h{i}"
        self._add_namespace(ns)
        # Made in the bridge's namespace with its peer moved straight into the host's:
        # neither end ever exists in the machine's own namespace.
        self._run("ip", "-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                  "netns", ns)
        self._run("ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0")
        self._run("ip", "-n", ns, "addr", "add", f"{self.address(host.name)}/24", "dev", "eth0")
        if host.rate:
            self._run(*self._tbf(ns, "eth0", host.rate))  # what the host sends
            self._run(*self._tbf(self.bridge_ns, port, host.rate))  # what it receives
        self._run("ip", "-n", ns, "link", "set", "eth0", "up")
        self._run("ip", "-n", self.bridge_ns, "link", "set", port, "up")

    def _tbf(self, ns: str, dev: str, rate: int) -> list[str]:
        # tc's "bps" means bytes per second; bits are spelt out to leave no doubt.
        return ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate * 8}bit",
                "burst", str(self.burst), "latency", f"{self.latency * 1000:g}ms"]

    @contextlib.contextmanager
    def inside(self, host: str) -> Iterator[None]:
        """The calling thread in `host`'s namespace for the block, then back where it was.

        Only this thread moves (setns(2)): processes it starts and sockets it
        opens meanwhile belong to `host`, and stay there after the block. An
        asyncio program calls it from its loop's thread, whose sockets then
        open inside.
        """
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            there = os.open(f"/run/netns/{self.namespace(host)}", os.O_RDONLY)
            try:
                _setns(there, f"into {self.namespace(host)}")
            finally:
                os.close(there)
            try:
                yield
            finally:
                _setns(back, f"back from {self.namespace(host)}")
        finally:
            os.close(back)

    def _run(self, *argv: str) -> None:
        if self.before_step is not None:
            self.before_step(list(argv))
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise NetnsError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-300:]}")

    def delete(self) -> None:
        """Stop what still runs inside, then delete every namespace made (their links go with them)."""
        for ns in reversed(self._made):
            delete_namespace(ns)
        self._made.clear()
        self.built = False

    # -- measuring -------------------------------------------------------------------------
    def counters(self) -> dict[str, tuple[int, int]]:
        """Bytes each host has sent and received over its link, read at the bridge's end."""
        out = subprocess.run(["ip", "-n", self.bridge_ns, "-s", "-j", "link", "show"], capture_output=True,
                             text=True, check=True).stdout
        by_port = {link["ifname"]: link["stats64"] for link in json.loads(out)}
        return {h.name: (by_port[f"h{i}"]["rx"]["bytes"], by_port[f"h{i}"]["tx"]["bytes"])
                for i, h in enumerate(self.hosts)}

    def qdiscs(self, host: str) -> tuple[str, str]:
        """The queues shaping `host`'s link as `tc` shows them: (sending, receiving)."""
        i = self._index(host)
        mine = subprocess.run(["tc", "-n", self.namespace(host), "qdisc", "show", "dev", "eth0"],
                              capture_output=True, text=True, check=True).stdout.strip()
        theirs = subprocess.run(["tc", "-n", self.bridge_ns, "qdisc", "show", "dev", f"h{i}"],
                                capture_output=True, text=True, check=True).stdout.strip()
        return mine, theirs


def _setns(fd: int, what: str) -> None:
    """The calling thread into the network namespace open at `fd`; NetnsError saying `what` failed."""
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise NetnsError(f"setns {what}: {os.strerror(ctypes.get_errno())}")


def check_available() -> None:
    """Raise NetnsUnavailable naming the cause unless this process can make namespaces."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root: run as root (sudo), or use the loopback variant")
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise NetnsUnavailable(f"{' and '.join(missing)} not found: install Debian's iproute2")
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsUnavailable(f"`ip netns` is unavailable here: {done.stderr.strip()[-200:]}")


def namespaces() -> list[str]:
    """Every network namespace `ip netns list` names."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def delete_namespace(ns: str) -> None:
    """Delete `ns` after stopping the processes still in it (each started inside a namespace this module made)."""
    pids = _pids(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _pids(ns)
        if not pids:
            break
    subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def _pids(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def sweep_dead_runs(names: Iterable[str] | None = None) -> list[str]:
    """Delete the namespaces of runs of this module whose process is gone (killed before it could clean up)."""
    swept = []
    for ns in namespaces() if names is None else names:
        m = _OURS.match(ns)
        if m and not _alive(int(m.group(1))):
            delete_namespace(ns)
            swept.append(ns)
    return swept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
