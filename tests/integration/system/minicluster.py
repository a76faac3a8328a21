"""The rest of a cluster around the API double: what the whole-system test needs to run the chart's pods.

Stand-ins, each doing the part of its Kubernetes counterpart that Nezha
depends on, driven only by the objects in the API double:

- StatefulSet controller: pods `<name>-<ordinal>` from the template for
  ordinals below `spec.replicas` (Parallel), with hostname and subdomain;
  pods at or above it deleted (the double's graceful deletion).
- Deployment controller: `spec.replicas` pods from the template; a pod
  that is deleted is replaced.
- Kubelet (one node): runs each pod of the release namespace (and of the
  namespaces a test adds to `namespaces`) as local processes
  (tests/integration/system/podspec.py), on its own loopback
  address (127.0.0.11, .12, ...), in a mount namespace whose /etc/hosts is
  the cluster DNS file below; waits for the Secrets and ConfigMaps a pod
  names (ContainerCreating); restarts containers per restartPolicy; runs
  readiness probes and writes the Ready condition; on deletionTimestamp
  sends SIGTERM, SIGKILL after the grace period, then removes the pod.
  Pods whose service account mounts a token get KUBECONFIG pointing at the
  double instead (the double speaks plain HTTP, the in-cluster loader
  needs HTTPS and fixed paths).
  A Job's pod (restartPolicy Never or OnFailure, run once) with init
  containers or several containers runs as the kubelet runs native sidecars
  (KEP-753): init containers in order, a restartable one
  (`restartPolicy: Always`) started and, once its startup probe passes
  (httpGet, tcpSocket or exec), the next one; then the main containers; a
  sidecar that exits is restarted; when every main container has exited,
  the sidecars get SIGTERM in reverse order and SIGKILL when the pod's
  grace period is over, and the pod (and its Job) completes. Such a pod has
  a loopback of its own in a cluster: here 127.0.0.1 in its args, probes
  and hostAliases is its pod IP (so the tests' own servers stay off
  127.0.0.1), and each container's /etc/hosts is the pod's hostAliases (or
  the file it mounts at /etc/hosts itself, which the kubelet then leaves
  alone) followed by cluster DNS and `public_hosts`, the world's DNS; its
  /etc/resolv.conf names a kube-dns stand-in (testkit's Nameserver, 127.0.0.10:53)
  answering the same names.
- kube-proxy: each Service's ClusterIP (the double allocates them on
  127.1.0.0/16) listens on its ports and forwards each connection to a
  ready endpoint, round robin.
- Cluster DNS: one hosts file, rewritten in place as Services and pods
  change: `<svc>.<ns>.svc` -> ClusterIP, and for a headless Service
  `<hostname>.<svc>.<ns>.svc` -> pod IP (not-ready pods too when
  publishNotReadyAddresses).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import random
import re
import shutil
import signal
import ssl
import string
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from testkit.nameserver import Nameserver
from tests.integration.system.podspec import Unresolvable, container_argv, remap, resolve_env

NODE = "node-1"


def _labels_match(selector: dict[str, str] | None, labels: dict[str, str] | None) -> bool:
    return bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


def _after(own: str, dns: str) -> str:
    """A container's /etc/hosts lines, then the "DNS" lines for names they do not map: a resolver asks DNS
    only for names /etc/hosts lacks, where one hosts file with both would give both addresses (multi on)."""
    mapped = {name for line in own.splitlines() for name in line.split()[1:]}
    return own + "".join(line + "\n" for line in dns.splitlines() if not mapped & set(line.split()[1:]))


def downward_value(pod: dict, path: str) -> str:
    """A downwardAPI volume item's content: metadata.name, .namespace, .uid, or one label or annotation."""
    meta = pod["metadata"]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    if path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return meta[path.split(".", 1)[1]]
    raise ValueError(f"pod {meta['name']}: downwardAPI fieldRef {path} is not one the stand-in knows")


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass
class PodRun:
    """One pod's (single) container as a process."""

    ns: str
    name: str
    uid: str
    ip: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    restart_policy: str
    readiness: dict | None
    ports: dict[str, int]
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    ready: bool | None = None  # as last written to the pod's status
    terminating: bool = False
    done: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)
    group: list["ContainerRun"] = field(default_factory=list)  # a pod of several containers (native sidecars)


@dataclass
class ContainerRun:
    """One container of a pod run as the kubelet runs native sidecars."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    cwd: Path
    kind: str  # "sidecar" (a restartable init container), "init" or "main"
    startup: dict | None = None
    hosts: Path | None = None  # its own /etc/hosts (a volume mounted there), else the pod's
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    stopping: bool = False
    exit_code: int | None = None


class MiniCluster:
    def __init__(self, *, api: Any, namespace: str, root: Path, kubeconfig: Path,
                 entrypoints: dict[str, list[str]]) -> None:
        self.api = api  # the KubeAPI double (its store is read directly; writes go over HTTP)
        self.namespace = namespace
        self.namespaces = {namespace}  # where the kubelet runs pods; tests may add one
        # What the kubelet did to the containers of multi-container pods, in order:
        # (pod, container, what), what = started | startup-passed | exited N | SIGTERM | SIGKILL.
        self.events: list[tuple[str, str, str]] = []
        # The /etc/hosts of each container of a multi-container pod: its file, and the lines before cluster DNS.
        self.pod_hosts: dict[tuple[str, str, str], tuple[Path, str]] = {}
        # Names the world's DNS would answer (a dataset host): in every pod's view, after the cluster's.
        self.public_hosts: dict[str, str] = {}
        # kube-dns: what a Job pod's /etc/resolv.conf names (port 53, as resolv.conf cannot say another).
        # kube-dns: the cluster DNS file's names (and `public_hosts`), asked by the Job pods' containers
        # through their /etc/resolv.conf, as a pod asks CoreDNS (a sidecar never reads its /etc/hosts for origins).
        self.dns = Nameserver({}, ttl=5)
        self.dns_ip = "127.0.0.10"
        self._dns_transport: asyncio.DatagramTransport | None = None
        self.root = root
        self.kubeconfig = kubeconfig
        self.entrypoints = entrypoints
        root.mkdir(parents=True, exist_ok=True)
        self.hosts = root / "hosts"
        self.hosts.write_text("127.0.0.1\tlocalhost\n")
        self.runs: dict[tuple[str, str], PodRun] = {}
        self.proxies: dict[tuple[str, int], asyncio.base_events.Server] = {}
        self.proxy_turn = itertools.count()
        self.forwards: set[asyncio.Task] = set()  # connections being forwarded, cancelled on stop
        self.ips = (f"127.0.0.{i}" for i in range(11, 250))
        self.problems: list[str] = []
        self.client = api.client()
        self.core = client.CoreV1Api(self.client)
        self._task: asyncio.Task | None = None
        self.unshare = shutil.which("unshare")
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        self._dns_transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: self.dns, local_addr=(self.dns_ip, 53))
        self._task = asyncio.get_running_loop().create_task(self._forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for run in self.runs.values():
            run.done = True
            for t in run.tasks:
                t.cancel()
            for proc in [run.proc, *(c.proc for c in run.group)]:
                if proc is not None and proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        if self._dns_transport is not None:
            self._dns_transport.close()
        for server in self.proxies.values():
            server.close()
        for task in list(self.forwards):
            task.cancel()
        await asyncio.gather(*self.forwards, return_exceptions=True)
        await self.http.close()
        await self.client.close()

    async def _forever(self) -> None:
        while True:
            for step in (self._statefulsets, self._deployments, self._kubelet, self._services, self._dns):
                try:
                    await step()
                except Exception as e:  # noqa: BLE001 - a stand-in's hiccup is retried on the next pass
                    self.problems.append(f"{step.__name__}: {type(e).__name__}: {e}")
            await asyncio.sleep(0.1)

    def objects(self, group: str, plural: str, ns: str | None = None) -> list[dict]:
        return [o for (n, _), o in list(self.api.objects_of(group, plural).items()) if ns is None or n == ns]

    # -- controllers ---------------------------------------------------------

    async def _create_pod(self, owner: dict, kind: str, name: str, extra_labels: dict[str, str],
                          spec_extra: dict[str, Any]) -> None:
        template = owner["spec"]["template"]
        meta = template.get("metadata") or {}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": {**(meta.get("labels") or {}), **extra_labels},
                            "annotations": dict(meta.get("annotations") or {}),
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind,
                                                 "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                                 "controller": True}]},
               "spec": {**template["spec"], **spec_extra, "nodeName": NODE}}
        with contextlib.suppress(ApiException):  # AlreadyExists: a pass that raced the last one
            (await self.core.create_namespaced_pod(owner["metadata"]["namespace"], pod,
                                                   _preload_content=False)).release()

    async def _statefulsets(self) -> None:
        for sts in self.objects("apps", "statefulsets", self.namespace):
            name, ns = sts["metadata"]["name"], sts["metadata"]["namespace"]
            replicas = sts["spec"].get("replicas", 1)
            pods = {p["metadata"]["name"]: p for p in self.objects("", "pods", ns)
                    if any(r.get("uid") == sts["metadata"]["uid"] for r in p["metadata"].get("ownerReferences") or [])}
            for i in range(replicas):
                pod_name = f"{name}-{i}"
                if pod_name not in pods:
                    await self._create_pod(sts, "StatefulSet", pod_name,
                                           {"statefulset.kubernetes.io/pod-name": pod_name,
                                            "apps.kubernetes.io/pod-index": str(i)},
                                           {"hostname": pod_name, "subdomain": sts["spec"].get("serviceName")})
            for pod_name, pod in pods.items():
                ordinal = int(pod_name.rsplit("-", 1)[1])
                if ordinal >= replicas and not pod["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(ApiException):  # NotFound: gone meanwhile
                        (await self.core.delete_namespaced_pod(pod_name, ns, _preload_content=False)).release()

    async def _deployments(self) -> None:
        for dep in self.objects("apps", "deployments", self.namespace):
            ns, uid = dep["metadata"]["namespace"], dep["metadata"]["uid"]
            live = [p for p in self.objects("", "pods", ns) if not p["metadata"].get("deletionTimestamp")
                    and any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]
            for _ in range(dep["spec"].get("replicas", 1) - len(live)):
                suffix = "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(5))
                await self._create_pod(dep, "Deployment", f"{dep['metadata']['name']}-{suffix}", {}, {})

    # -- kubelet ---------------------------------------------------------------

    async def _kubelet(self) -> None:
        present = set()
        for pod in [p for ns in sorted(self.namespaces) for p in self.objects("", "pods", ns)]:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            present.add(key)
            run = self.runs.get(key)
            if run is not None and run.uid != pod["metadata"]["uid"]:
                await self._kill(run)
                run = None
                del self.runs[key]
            if pod["metadata"].get("deletionTimestamp"):
                if run is None:
                    await self._remove(pod)
                elif not run.terminating:
                    run.terminating = True
                    grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
                    run.tasks.append(asyncio.get_running_loop().create_task(
                        self._guard(self._terminate(run, pod, grace), run)))
                continue
            if run is None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                await self._admit(pod)
        for key in set(self.runs) - present:
            run = self.runs.pop(key)
            await self._kill(run)

    async def _admit(self, pod: dict) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        status = pod.get("status") or {}
        if not status.get("podIP"):
            ip = next(self.ips)
            (await self.core.patch_namespaced_pod_status(name, ns, {"status": {
                "phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "False"}]}}, _preload_content=False)).release()
            return  # next pass sees the IP
        spec = pod["spec"]
        if spec.get("initContainers") or len(spec["containers"]) > 1:
            await self._admit_group(pod)
            return
        (container,) = spec["containers"]
        secrets = {o["metadata"]["name"]: o for o in self.objects("", "secrets", ns)}
        configmaps = {o["metadata"]["name"]: o for o in self.objects("", "configmaps", ns)}
        try:
            env = resolve_env(pod, container, secret=secrets.get, configmap=configmaps.get)
            mounts = self._volumes(pod, container, secrets, configmaps)
        except Unresolvable:
            return  # ContainerCreating: try again next pass
        home = self.root / "pods" / name / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "LANG": "C.UTF-8"}
        if "/tmp" in mounts:
            env["TMPDIR"] = str(mounts["/tmp"])
        sa = next((o for o in self.objects("", "serviceaccounts", ns)
                   if o["metadata"]["name"] == spec.get("serviceAccountName", "default")), {})
        if spec.get("automountServiceAccountToken", sa.get("automountServiceAccountToken", True)) is not False:
            env["KUBECONFIG"] = str(self.kubeconfig)
        argv = container_argv(container, env, mounts, entrypoints=self.entrypoints)
        ports = {p["name"]: p["containerPort"] for p in container.get("ports") or [] if p.get("name")}
        run = PodRun(ns=ns, name=name, uid=pod["metadata"]["uid"], ip=status["podIP"], argv=argv, env=env,
                     log=self.root / "logs" / f"{name}.log", restart_policy=spec.get("restartPolicy", "Always"),
                     readiness=container.get("readinessProbe"), ports=ports)
        run.log.parent.mkdir(exist_ok=True)
        self.runs[(ns, name)] = run
        await self._launch(run)
        loop = asyncio.get_running_loop()
        run.tasks += [loop.create_task(self._guard(self._supervise(run), run)),
                      loop.create_task(self._guard(self._probe(run), run))]

    async def _guard(self, coro, run: PodRun) -> None:
        """A stand-in task that fails says so in `problems` instead of dying silently."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            self.problems.append(f"{run.name}: {type(e).__name__}: {e}")

    def _volumes(self, pod: dict, container: dict, secrets: dict, configmaps: dict) -> dict[str, Path]:
        name = pod["metadata"]["name"]
        owner = (pod["metadata"].get("ownerReferences") or [{}])[0]
        claims = set()
        if owner.get("kind") == "StatefulSet":
            sts = next(o for o in self.objects("apps", "statefulsets", pod["metadata"]["namespace"])
                       if o["metadata"]["uid"] == owner["uid"])
            claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates") or []}
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: dict[str, Path] = {}
        for m in container.get("volumeMounts") or []:
            vname = m["name"]
            if vname in claims:  # a PVC: kept across pod deletions, reused by the next pod of that ordinal
                where = self.root / "pvc" / f"{vname}-{name}"
                where.mkdir(parents=True, exist_ok=True)
            else:
                vol = volumes[vname]
                where = self.root / "pods" / name / "volumes" / vname
                where.mkdir(parents=True, exist_ok=True)
                if "secret" in vol:
                    obj = secrets.get(vol["secret"]["secretName"])
                    if obj is None:
                        raise Unresolvable(f"secret {vol['secret']['secretName']}")
                    for k, v in (obj.get("data") or {}).items():
                        (where / k).write_bytes(base64.b64decode(v))
                elif "configMap" in vol:
                    obj = configmaps.get(vol["configMap"]["name"])
                    if obj is None:
                        raise Unresolvable(f"configmap {vol['configMap']['name']}")
                    for k, v in (obj.get("data") or {}).items():
                        (where / k).write_text(v)
                elif "downwardAPI" in vol:
                    for item in vol["downwardAPI"].get("items") or []:
                        (where / item["path"]).write_text(downward_value(pod, item["fieldRef"]["fieldPath"]))
                elif "emptyDir" not in vol:
                    raise ValueError(f"pod {name}: volume {vname} of an unsupported kind {sorted(vol)}")
                if m.get("subPath"):  # a file or folder in the volume; in an emptyDir made on first use
                    where = where / m["subPath"]
                    if "emptyDir" in vol:
                        where.mkdir(parents=True, exist_ok=True)
            mounts[m["mountPath"]] = where
        return mounts

    async def _launch(self, run: PodRun) -> None:
        script = 'mount --bind "$NEZHA_TEST_HOSTS" /etc/hosts && unset NEZHA_TEST_HOSTS && exec "$@"'
        out = open(run.log, "ab")
        try:
            run.proc = await asyncio.create_subprocess_exec(
                self.unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", *run.argv,
                env={**run.env, "NEZHA_TEST_HOSTS": str(self.hosts)}, stdout=out, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)
        finally:
            out.close()

    async def _supervise(self, run: PodRun) -> None:
        while not run.done:
            assert run.proc is not None
            code = await run.proc.wait()
            if run.terminating or run.done:
                return
            await self._set_ready(run, False)
            if run.restart_policy == "Never" or run.restart_policy == "OnFailure" and code == 0:
                run.done = True
                await self._status(run, {"phase": "Succeeded" if code == 0 else "Failed"})
                return
            run.restarts += 1
            await asyncio.sleep(min(0.5 * run.restarts, 3.0))  # CrashLoopBackOff, shortened
            if not (run.terminating or run.done):
                await self._launch(run)

    async def _probe(self, run: PodRun) -> None:
        probe = run.readiness
        if probe is None:
            await self._set_ready(run, True)
            return
        period = min(float(probe.get("periodSeconds", 10)), 0.5)
        while not run.done and not run.terminating:
            await self._set_ready(run, await self._probe_once(run, probe))
            await asyncio.sleep(period)

    async def _probe_once(self, run: PodRun, probe: dict) -> bool:
        if run.proc is None or run.proc.returncode is not None:
            return False
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = run.ports.get(get["port"], get["port"])
            scheme = get.get("scheme", "HTTP").lower()
            try:
                # The kubelet does not verify the serving certificate.
                async with self.http.get(f"{scheme}://{run.ip}:{port}{get.get('path', '/')}",
                                         ssl=False if scheme == "https" else None) as r:
                    return 200 <= r.status < 400
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ssl.SSLError):
                return False
        if "tcpSocket" in probe:
            port = run.ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
            try:
                _, w = await asyncio.wait_for(asyncio.open_connection(run.ip, int(port)), 1)
                w.close()
                return True
            except (OSError, asyncio.TimeoutError):
                return False
        raise ValueError(f"{run.name}: unsupported probe {sorted(probe)}")

    async def _set_ready(self, run: PodRun, ready: bool) -> None:
        if ready == run.ready or run.done:
            return
        run.ready = ready
        await self._status(run, {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "c", "ready": ready, "restartCount": run.restarts}]})

    async def _status(self, run: PodRun, status: dict) -> None:
        pod = self.api.objects_of("", "pods").get((run.ns, run.name))
        if pod is None or pod["metadata"]["uid"] != run.uid:
            return
        merged = {**(pod.get("status") or {}), **status}
        try:
            response = await self.core.patch_namespaced_pod_status(run.name, run.ns, {"status": merged},
                                                                   _preload_content=False)
            response.release()
        except ApiException as e:
            self.problems.append(f"status of {run.name}: {e.status} {e.body}")

    async def _terminate(self, run: PodRun, pod: dict, grace: int) -> None:
        """What the kubelet does for a deletionTimestamp: SIGTERM, SIGKILL after the grace period, then remove."""
        if run.group:
            await self._stop(run, [c for c in run.group if c.kind == "main"] + [
                c for c in reversed(run.group) if c.kind == "sidecar"], grace)
            run.done = True
            self.runs.pop((run.ns, run.name), None)
            await self._remove(pod)
            return
        await self._set_ready(run, False)
        if run.proc is not None and run.proc.returncode is None:
            run.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(run.proc.wait(), grace)
            except asyncio.TimeoutError:
                run.proc.kill()
                await run.proc.wait()
        run.done = True
        self.runs.pop((run.ns, run.name), None)
        await self._remove(pod)

    async def _kill(self, run: PodRun) -> None:
        run.done = True
        for t in run.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        for proc in [run.proc, *(c.proc for c in run.group)]:
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
        for c in run.group:
            self.pod_hosts.pop((run.ns, run.name, c.name), None)

    # -- native sidecars (pods of several containers) -----------------------------------

    async def _admit_group(self, pod: dict) -> None:
        ns, name, spec = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["spec"]
        ip = pod["status"]["podIP"]
        if spec.get("restartPolicy", "Always") == "Always":
            # Run-to-completion pods (Jobs) only: main containers that restart, readiness probes on them and
            # their endpoints are the single-container path's; say so rather than run such a pod wrongly.
            problem = f"{name}: a pod of several containers with restartPolicy Always is not run by the stand-in"
            if problem not in self.problems:
                self.problems.append(problem)
            return
        secrets = {o["metadata"]["name"]: o for o in self.objects("", "secrets", ns)}
        configmaps = {o["metadata"]["name"]: o for o in self.objects("", "configmaps", ns)}
        work = self.root / "pods" / name / "work"
        work.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        group = []
        try:
            for kind_of, c in [("init", c) for c in spec.get("initContainers") or []] + \
                              [("main", c) for c in spec["containers"]]:
                env = resolve_env(pod, c, secret=secrets.get, configmap=configmaps.get)
                mounts = self._volumes(pod, c, secrets, configmaps)
                # Paths on volumes in env, as in args: a runtime would mount the volume there (the CA bundle's).
                env = {k: remap(v, mounts) for k, v in env.items()}
                env = {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "LANG": "C.UTF-8"}
                if "/tmp" in mounts:
                    env["TMPDIR"] = str(mounts["/tmp"])
                if spec.get("automountServiceAccountToken") is not False:
                    env["KUBECONFIG"] = str(self.kubeconfig)
                argv = [a.replace("127.0.0.1", ip)
                        for a in container_argv(c, env, mounts, entrypoints=self.entrypoints)]
                kind = "sidecar" if kind_of == "init" and c.get("restartPolicy") == "Always" else kind_of
                group.append(ContainerRun(name=c["name"], argv=argv, env=env, cwd=work, kind=kind,
                                          log=self.root / "logs" / f"{name}.{c['name']}.log",
                                          startup=c.get("startupProbe"), hosts=mounts.get("/etc/hosts")))
        except Unresolvable:
            return  # ContainerCreating: try again next pass
        aliases = "".join(f"{a['ip'].replace('127.0.0.1', ip)}\t{h}\n" for a in spec.get("hostAliases") or []
                          for h in a.get("hostnames") or [])
        # /etc/hosts comes first (a pod's aliases win over DNS), then cluster DNS. A container that mounts an
        # /etc/hosts of its own gets that file's lines instead of the pod's: the kubelet leaves it alone.
        for c in group:
            own = c.hosts.read_text() if c.hosts is not None else aliases
            c.hosts = self.root / "pods" / name / f"hosts.{c.name}"
            c.hosts.write_text(_after(own, self.hosts.read_text()))
            self.pod_hosts[(ns, name, c.name)] = (c.hosts, own)
        run = PodRun(ns=ns, name=name, uid=pod["metadata"]["uid"], ip=ip, argv=[], env={},
                     log=self.root / "logs" / f"{name}.log", restart_policy=spec.get("restartPolicy", "Always"),
                     readiness=None, ports={}, group=group)
        self.runs[(ns, name)] = run
        run.tasks.append(asyncio.get_running_loop().create_task(self._guard(self._lifecycle(run, pod), run)))

    async def _launch_container(self, run: PodRun, c: ContainerRun) -> None:
        script = ('mount --bind "$NEZHA_TEST_HOSTS" /etc/hosts && mount --bind "$NEZHA_TEST_RESOLV" /etc/resolv.conf'
                  ' && unset NEZHA_TEST_HOSTS NEZHA_TEST_RESOLV && exec "$@"')
        # /etc/resolv.conf as the kubelet writes it for a ClusterFirst pod: kube-dns, the namespace's search list.
        resolv = self.root / "pods" / run.name / "resolv.conf"
        resolv.write_text(f"search {run.ns}.svc.cluster.local svc.cluster.local cluster.local\n"
                          f"nameserver {self.dns_ip}\noptions ndots:5\n")
        with open(c.log, "ab") as out:
            c.proc = await asyncio.create_subprocess_exec(
                self.unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", *c.argv,
                env={**c.env, "NEZHA_TEST_HOSTS": str(c.hosts), "NEZHA_TEST_RESOLV": str(resolv)}, stdout=out,
                stderr=asyncio.subprocess.STDOUT, cwd=str(c.cwd), start_new_session=True)
        self.events.append((run.name, c.name, "started"))

    async def _lifecycle(self, run: PodRun, pod: dict) -> None:
        """Init containers in order (a sidecar until its startup probe passes), then the main ones; when
        they have all exited, the sidecars are stopped and the pod's phase (and its Job's) is written."""
        grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        await self._status(run, {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]})
        sidecars = []
        phase = None
        for c in [c for c in run.group if c.kind != "main"]:
            await self._launch_container(run, c)
            if c.kind == "sidecar":
                sidecars.append(c)
                run.tasks.append(asyncio.get_running_loop().create_task(
                    self._guard(self._keep_running(run, c), run)))
                if not await self._started(run, c):
                    return  # the pod is being deleted: _terminate stops its containers
                self.events.append((run.name, c.name, "startup-passed"))
                continue
            c.exit_code = await c.proc.wait()
            self.events.append((run.name, c.name, f"exited {c.exit_code}"))
            if c.exit_code != 0:
                phase = "Failed"
                break
        mains = [c for c in run.group if c.kind == "main"]
        if phase is None:
            for c in mains:
                await self._launch_container(run, c)
            await self._status(run, {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
            for c in mains:
                c.exit_code = await c.proc.wait()
                self.events.append((run.name, c.name, f"exited {c.exit_code}"))
            phase = "Succeeded" if all(c.exit_code == 0 for c in mains) else "Failed"
        await self._stop(run, list(reversed(sidecars)), grace)
        run.done = True
        await self._status(run, {"phase": phase, "conditions": [{"type": "Ready", "status": "False"}],
                                 "containerStatuses": [{"name": c.name, "ready": False, "restartCount": c.restarts,
                                                        "state": {"terminated": {"exitCode": c.exit_code}}}
                                                       for c in run.group if c.exit_code is not None]})
        await self._complete_job(pod, phase)

    async def _keep_running(self, run: PodRun, c: ContainerRun) -> None:
        """A sidecar that exits is started again (restartPolicy: Always), until the pod stops it."""
        while True:
            code = await c.proc.wait()
            if c.stopping or run.done or run.terminating:
                return
            self.events.append((run.name, c.name, f"exited {code}"))
            c.restarts += 1
            await asyncio.sleep(min(0.5 * c.restarts, 3.0))  # CrashLoopBackOff, shortened
            if c.stopping or run.done or run.terminating:
                return
            await self._launch_container(run, c)

    async def _started(self, run: PodRun, c: ContainerRun) -> bool:
        """The startup probe until it passes (True), or the pod is stopped (False). A container that fails it
        failureThreshold times in a row is killed, and `_keep_running` starts it again, as the kubelet does."""
        probe = c.startup
        if probe is None:
            return True
        period = min(float(probe.get("periodSeconds", 10)), 0.5)
        failures, threshold = 0, int(probe.get("failureThreshold", 3))
        while not (run.done or run.terminating):
            if await self._check(run, c, probe):
                return True
            failures += 1
            if failures >= threshold:
                self.events.append((run.name, c.name, "startup-failed"))
                if c.proc is not None and c.proc.returncode is None:
                    c.proc.kill()
                failures = 0
            await asyncio.sleep(period)
        return False

    async def _check(self, run: PodRun, c: ContainerRun, probe: dict) -> bool:
        if "exec" not in probe:
            fake = PodRun(ns=run.ns, name=run.name, uid=run.uid, ip=run.ip, argv=[], env={}, log=run.log,
                          restart_policy="Always", readiness=None, ports={}, proc=c.proc)
            return await self._probe_once(fake, probe)
        if c.proc is None or c.proc.returncode is not None:
            return False
        command = [a.replace("127.0.0.1", run.ip) for a in probe["exec"]["command"]]
        program = self.entrypoints.get(command[0], [shutil.which(command[0], path=c.env.get("PATH")) or command[0]])
        proc = await asyncio.create_subprocess_exec(*program, *command[1:], env=c.env, cwd=str(c.cwd),
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)
        try:
            return await asyncio.wait_for(proc.wait(), float(probe.get("timeoutSeconds", 1)) + 5) == 0
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return False

    async def _stop(self, run: PodRun, containers: list[ContainerRun], grace: float) -> None:
        """SIGTERM to each running container in the order given, SIGKILL to those still running after `grace`."""
        deadline = asyncio.get_running_loop().time() + grace
        for c in containers:
            c.stopping = True
            if c.proc is not None and c.proc.returncode is None:
                c.proc.send_signal(signal.SIGTERM)
                self.events.append((run.name, c.name, "SIGTERM"))
        for c in containers:
            if c.proc is None:
                continue
            try:
                code = await asyncio.wait_for(c.proc.wait(),
                                              max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                c.proc.kill()
                self.events.append((run.name, c.name, "SIGKILL"))
                code = await c.proc.wait()
            if c.exit_code is None:
                c.exit_code = code

    async def _complete_job(self, pod: dict, phase: str) -> None:
        """The Job controller's part once its pod has finished: Complete (or Failed), with the counts."""
        owner = next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("kind") == "Job"), None)
        if owner is None:
            return
        done = phase == "Succeeded"
        status = {"succeeded" if done else "failed": 1, "active": 0, "conditions": [
            *([{"type": "SuccessCriteriaMet", "status": "True"}] if done else []),
            {"type": "Complete" if done else "Failed", "status": "True"}]}
        try:
            (await client.BatchV1Api(self.client).patch_namespaced_job_status(
                owner["name"], pod["metadata"]["namespace"], {"status": status}, _preload_content=False)).release()
        except ApiException as e:
            self.problems.append(f"status of job {owner['name']}: {e.status} {e.body}")

    async def _remove(self, pod: dict) -> None:
        with contextlib.suppress(ApiException):  # NotFound: gone meanwhile
            (await self.core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                                   grace_period_seconds=0, _preload_content=False)).release()

    # -- kube-proxy and DNS ----------------------------------------------------------

    def _endpoints(self, svc: dict, port: dict) -> list[tuple[str, int]]:
        ns = svc["metadata"]["namespace"]
        out = []
        for pod in self.objects("", "pods", ns):
            if not _labels_match(svc["spec"].get("selector"), pod["metadata"].get("labels")):
                continue
            ip = (pod.get("status") or {}).get("podIP")
            if not ip or not (_ready(pod) or svc["spec"].get("publishNotReadyAddresses")):
                continue
            target = port.get("targetPort", port["port"])
            if isinstance(target, str):
                named = {p.get("name"): p["containerPort"] for c in pod["spec"]["containers"]
                         for p in c.get("ports") or []}
                if target not in named:
                    continue
                target = named[target]
            out.append((ip, int(target)))
        return sorted(out)

    async def _services(self) -> None:
        for svc in self.objects("", "services", self.namespace):
            ip = svc["spec"].get("clusterIP")
            if not ip or ip == "None":
                continue
            for port in svc["spec"].get("ports") or []:
                key = (ip, port["port"])
                ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
                self.api.service_addresses[(ns, name, port["port"])] = f"{ip}:{port['port']}"
                if key in self.proxies:
                    continue

                async def forward(reader, writer, svc_key=(ns, name), port_spec=port):
                    await self._forward(reader, writer, svc_key, port_spec)

                self.proxies[key] = await asyncio.start_server(forward, ip, port["port"], reuse_address=True)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       svc_key: tuple[str, str], port: dict) -> None:
        task = asyncio.current_task()
        self.forwards.add(task)
        try:
            await self._forward_one(reader, writer, svc_key, port)
        finally:
            self.forwards.discard(task)

    async def _forward_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           svc_key: tuple[str, str], port: dict) -> None:
        svc = self.api.objects_of("", "services").get(svc_key)
        endpoints = self._endpoints(svc, port) if svc else []
        if not endpoints:
            writer.close()
            return
        ip, target = endpoints[next(self.proxy_turn) % len(endpoints)]
        try:
            up_reader, up_writer = await asyncio.open_connection(ip, target)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(256 * 1024):
                    dst.write(data)
                    await dst.drain()
                if dst.can_write_eof():
                    dst.write_eof()
            except (ConnectionError, OSError):
                pass

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    async def _dns(self) -> None:
        lines = ["127.0.0.1\tlocalhost"]
        pods = self.objects("", "pods", self.namespace)
        for svc in self.objects("", "services", self.namespace):
            name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
            ip = svc["spec"].get("clusterIP")
            if ip and ip != "None":
                lines.append(f"{ip}\t{name}.{ns}.svc {name}.{ns}.svc.cluster.local")
                continue
            for pod in pods:
                pip = (pod.get("status") or {}).get("podIP")
                spec = pod["spec"]
                if pip and spec.get("subdomain") == name and spec.get("hostname") and \
                        (_ready(pod) or svc["spec"].get("publishNotReadyAddresses")):
                    lines.append(f"{pip}\t{spec['hostname']}.{name}.{ns}.svc {spec['hostname']}.{name}.{ns}.svc"
                                 ".cluster.local")
        lines += [f"{ip}\t{host}" for host, ip in sorted(self.public_hosts.items())]
        text = "\n".join(lines) + "\n"
        records: dict[str, str] = {}
        for line in lines[1:]:  # not localhost: a nameserver does not answer it
            ip, *names = line.split()
            for name in names:
                records.setdefault(name.lower(), ip)
        self.dns.records = records
        for path, own in [(self.hosts, ""), *list(self.pod_hosts.values())]:
            if _after(own, text) != path.read_text():
                # In place (same inode): the pods' bind mounts of this file see the new text.
                with open(path, "r+") as f:
                    f.seek(0)
                    f.write(_after(own, text))
                    f.truncate()

    # -- what tests ask ----------------------------------------------------------------

    async def exec(self, name: str, argv: list[str], timeout: float = 30) -> str:
        """`kubectl exec POD -- ARGV`: in the pod's environment and its view of cluster DNS."""
        run = self.run_of(name)
        program = self.entrypoints.get(argv[0], [shutil.which(argv[0]) or argv[0]])
        script = 'mount --bind "$NEZHA_TEST_HOSTS" /etc/hosts && unset NEZHA_TEST_HOSTS && exec "$@"'
        proc = await asyncio.create_subprocess_exec(
            self.unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", *program, *argv[1:],
            env={**run.env, "NEZHA_TEST_HOSTS": str(self.hosts)}, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        assert proc.returncode == 0, f"exec {name} {argv}: exit {proc.returncode}: {err.decode()}"
        return out.decode()

    def run_of(self, name: str) -> PodRun:
        return self.runs[(self.namespace, name)]

    def logs(self) -> str:
        out = ["pods: " + ", ".join(
            f"{p['metadata']['name']}={(p.get('status') or {}).get('phase')}/ready={_ready(p)}/"
            f"{(p.get('status') or {}).get('podIP')}" for p in self.objects("", "pods"))]
        for log in sorted((self.root / "logs").glob("*.log")):
            out.append(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(out)

    async def wait(self, what: str, check, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; problems: {self.problems[-40:]}\n{self.logs()}")
            await asyncio.sleep(0.2)
