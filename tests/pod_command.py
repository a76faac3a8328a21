"""A pod's own command, run here the way its node would: /etc/hosts as kubelet writes it for the pod.

Used by the tests that follow a labelled Job's pod all the way: the
webhook's end-to-end test and the whole-system test. The command runs in a
mount namespace whose /etc/hosts is the pod's (so hostAliases work and the
machine's file is never touched), in its own session (a hung command is
killed with its shell), without proxy variables from the machine.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
from pathlib import Path

from testkit.tools import require_tool


def cover_for_hosts(request) -> Path:
    """The machine's /etc/hosts, which the pods' bind mounts cover. A bare root
    (debootstrap minbase, a fresh CI machine) has none: an empty one is made,
    which maps nothing, and removed after the test."""
    hosts = Path("/etc/hosts")
    if not hosts.exists():
        hosts.touch()
        request.addfinalizer(lambda: hosts.unlink(missing_ok=True))
    return hosts


def mount_point(request, path: Path) -> Path:
    """A folder at `path` for a pod's volume to be bound over, made (and removed after the test) if missing."""
    if not path.exists():
        made = []
        for folder in reversed([path, *path.parents]):
            if not folder.exists():
                folder.mkdir()
                made.append(folder)
        request.addfinalizer(lambda: [f.rmdir() for f in reversed(made)])
    return path


def container_env(pod: dict, index: int = 0) -> dict[str, str]:
    """The plain variables a pod's container sets (value, not valueFrom)."""
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][index].get("env") or [] if "value" in e}


def kubelet_hosts_file(pod: dict, pod_ip: str = "10.244.0.7") -> str:
    """/etc/hosts as kubelet writes it for a pod (managedHostsFileContent + hostsEntriesFromHostAliases)."""
    lines = ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback", "fe00::0\tip6-localnet", "fe00::0\tip6-mcastprefix",
             "fe00::1\tip6-allnodes", "fe00::2\tip6-allrouters", f"{pod_ip}\t{pod['metadata']['name']}", ""]
    aliases = pod["spec"].get("hostAliases") or []
    if aliases:
        lines.append("# Entries added by HostAliases.")
        lines += [f"{a['ip']}\t{h}" for a in aliases for h in a.get("hostnames") or []]
    return "\n".join(lines) + "\n"


async def run_pod_command(pod: dict, workdir: Path, *, options: tuple[str, ...] = (), timeout: float = 60,
                          context: str = "", env: dict[str, str] | None = None,
                          mounts: dict[str, Path] | None = None) -> str:
    """Run the pod's first container's command (wget here) in `workdir`; its output, or AssertionError.
    `env` is set on top of this machine's environment, as a container's own variables would be;
    `mounts` binds folders (source) over paths (target, which must exist) as a pod's volumes would be."""
    command = pod["spec"]["containers"][0]["command"]  # the pod's own command, unchanged
    program = require_tool(command[0])
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = workdir / "hosts"
    hosts.write_text(kubelet_hosts_file(pod))
    binds = "".join(f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)} && "
                    for target, source in (mounts or {}).items())
    script = (f"mount --bind {shlex.quote(str(hosts))} /etc/hosts && {binds}cd {shlex.quote(str(workdir))} && "
              f"{shlex.quote(program)} {' '.join(shlex.quote(a) for a in (*options, *command[1:]))}")
    env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()}, **(env or {})}
    log = workdir / "command.log"
    with open(log, "wb") as out:  # a file, not a pipe: nothing blocks on a full pipe
        proc = await asyncio.create_subprocess_exec(require_tool("unshare"), "-m", "sh", "-c", script, env=env,
                                                    stdout=out, stderr=asyncio.subprocess.STDOUT,
                                                    start_new_session=True)
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise AssertionError(f"{command[0]} did not finish in {timeout:g} s: {log.read_text()}\n{context}")
    assert proc.returncode == 0, f"{command[0]} exited {proc.returncode}: {log.read_text()}\n{context}"
    return log.read_text()
