"""The whole system, run from the chart's own pod specs (issue 11).

`helm install` puts the chart's objects into the API double; the
stand-ins of tests/integration/system/minicluster.py run every pod they
describe as a local process with the container's own command, args and
env. Nothing the chart says is typed here again: a wrong flag, a missing
env variable, a path on no volume, a probe on the wrong port fails this
test. Then, against a real redis-server (the chart's) and a throttled
local origin, a user's day: label a Job, download cold then warm,
`kubectl scale` up and down, lose the leading controller.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from pathlib import Path

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from nezha.index.handle import Index
from nezha.keys import cache_key, parse_target
from testkit.tools import require_tool
from tests.integration.system.conftest import NS
from tests.pod_command import container_env, mount_point, run_pod_command

pytestmark = pytest.mark.timeout(300)

CIFAR = "/~kriz/cifar-100-python.tar.gz"


def training_job(name: str, url: str, label: tuple[str, str]) -> dict:
    """A Job as a user writes it: the label the chart's rule matches, an unmodified command."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": {label[0]: label[1]}},
                                  "spec": {"restartPolicy": "Never", "containers": [
                                      {"name": "train", "image": "busybox", "command": ["wget", url]}]}}}}


def rule_label(system) -> tuple[str, str]:
    """The label the chart's rules ConfigMap says to put on a Job (its first rule)."""
    rules = yaml.safe_load(system.obj("", "configmaps", "nezha-webhook-rules")["data"]["config"])
    return rules[0]["app"], rules[0]["label"]


async def ring_of(system) -> tuple[int | None, dict[str, str]]:
    index = Index(redis_url=system.redis_url(), node_id=None)
    try:
        membership = await index.get_membership()
    except Exception:  # noqa: BLE001 - not up yet
        return None, {}
    finally:
        await index.close()
    if membership is None:
        return None, {}
    return membership.epoch, dict(membership.nodes)


async def chart_is_up(system) -> None:
    """Everything the chart describes is up: three nodes in the ring, the webhook trusted and ready."""
    await system.mini.wait("a ring of the three cache pods",
                           lambda: _members(ring_of(system), {f"nezha-cache-{i}" for i in range(3)}), timeout=60)
    await system.mini.wait("the certificates Job to patch the caBundle", lambda: (system.obj(
        "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "nezha-webhook", None)
        ["webhooks"][0]["clientConfig"].get("caBundle")), timeout=60)
    await system.mini.wait("a ready webhook pod", lambda: any(
        r.ready for (ns, n), r in system.mini.runs.items() if n.startswith("nezha-webhook-")
        and not n.startswith("nezha-webhook-certs")), timeout=60)


async def run_job_pod(system, kube, name: str, url: str) -> tuple[bytes, str]:
    """Create the Job, take the pod the double made through admission, run its own command with its hostAliases."""
    await client.BatchV1Api(kube).create_namespaced_job("ml", training_job(name, url, rule_label(system)))
    pod = await system.mini.wait(f"the pod of Job {name}", lambda: next(
        (p for (ns, _), p in system.api.objects_of("", "pods").items()
         if ns == "ml" and p["metadata"]["labels"].get("job-name") == name), None), timeout=10)
    cache_ip = system.service_ip("nezha-cache")
    assert pod["spec"].get("hostAliases") == [{"ip": cache_ip, "hostnames": ["www.cs.toronto.edu"]}], \
        f"{pod['spec'].get('hostAliases')}; admission: {system.api.admission_calls[-1:]}"
    workdir = system.root / "jobs" / name
    log = await run_pod_command(pod, workdir, context=system.mini.logs())
    return (workdir / Path(url).name).read_bytes(), log


async def test_the_chart_runs_as_a_system_a_job_downloads_through_it_and_scaling_loses_nothing(system):
    payload = os.urandom(3_000_000)
    system.origin.put(CIFAR, payload, rate=6_000_000)
    url = f"http://www.cs.toronto.edu{CIFAR}"
    kube = system.api.client()
    try:
        # Everything the chart describes comes up: three nodes in the ring, the webhook trusted.
        await chart_is_up(system)

        # 1-2. A labelled Job's pod gets hostAliases; its own wget goes through the cache, cold then warm.
        cold, _ = await run_job_pod(system, kube, "train-cold", url)
        assert hashlib.sha256(cold).digest() == hashlib.sha256(payload).digest()
        assert system.origin.requests[CIFAR] == 1
        warm, _ = await run_job_pod(system, kube, "train-warm", url)
        assert warm == payload
        assert system.origin.requests[CIFAR] == 1  # the warm copy came from the cache

        # What NOTES.txt tells a user to type, run inside the pods it names (kubectl exec).
        async def cluster_hits() -> int:
            """hits + peer_hits: the node the client reached counts the request (docs/redis-schema.md)."""
            out = (await system.mini.exec("nezha-redis-0", [
                "sh", "-c", 'redis-cli -h "$POD_IP" HGETALL nezha:stats:cluster'])).split()
            fields = dict(zip(out[::2], out[1::2]))
            return int(fields.get("hits", 0)) + int(fields.get("peer_hits", 0))

        await system.mini.wait("the hit in nezha:stats:cluster", cluster_hits, timeout=10)
        stats = json.loads(await system.mini.exec("nezha-cache-0", ["nezha", "stats", "--json"]))
        assert stats["cluster"]["hits"] + stats["cluster"]["peer_hits"] == 1, stats
        assert stats["cluster"]["misses"] == 1, stats

        # More objects, fetched the way a pod with the hostAliases fetches them: through the cache Service.
        paths = [f"/datasets/shard-{i:02d}.bin" for i in range(16)]
        for p in paths:
            system.origin.put(p, hashlib.sha256(p.encode()).digest() * 4096)
        async with aiohttp.ClientSession() as http:
            for p in paths:
                assert await fetch(http, system.service_ip("nezha-cache"), p) == system.origin.files[p]

            # 3. kubectl scale up: the ring moves to a new epoch and every node serves with it.
            epoch3, _ = await ring_of(system)
            await system.run(*system.kubectl, "-n", NS, "scale", "statefulset", "nezha-cache", "--replicas=5")
            five = {f"nezha-cache-{i}" for i in range(5)}
            await system.mini.wait("a ring of five", lambda: _members(ring_of(system), five), timeout=60)
            epoch5, nodes = await ring_of(system)
            assert epoch5 > epoch3
            await system.mini.wait("every node on the new ring", lambda: _all_on(http, system, five, epoch5),
                                   timeout=30)
            for name in sorted(five):  # entering through any node, every object is there
                ip = system.mini.run_of(name).ip
                for p in paths[:4]:
                    assert await fetch(http, f"{ip}:{system.mini.run_of(name).ports['http']}", p) == \
                        system.origin.files[p]
            fetched = {p: system.origin.requests[p] for p in [CIFAR, *paths]}

            # 4. kubectl scale down to 2: pods leave as Kubernetes removes them, handing off first.
            await system.run(*system.kubectl, "-n", NS, "scale", "statefulset", "nezha-cache", "--replicas=2")
            two = {"nezha-cache-0", "nezha-cache-1"}
            await system.mini.wait("a ring of two", lambda: _members(ring_of(system), two), timeout=60)
            await system.mini.wait("the three pods gone", lambda: not any(
                ns == NS and n in ("nezha-cache-2", "nezha-cache-3", "nezha-cache-4")
                for (ns, n) in system.api.objects_of("", "pods")), timeout=60)
            for p in [CIFAR, *paths]:
                assert await fetch(http, system.service_ip("nezha-cache"), p) == system.origin.files[p]
            assert {p: system.origin.requests[p] for p in fetched} == fetched, "an object was fetched again"

            # 5. The leading controller dies without a word; the standby takes the Lease, the next scale works.
            lease = system.obj("coordination.k8s.io", "leases", "nezha-controller")
            leader = lease["spec"]["holderIdentity"]
            run = system.mini.run_of(leader)
            os.killpg(run.proc.pid, signal.SIGKILL)
            await system.run(*system.kubectl, "-n", NS, "delete", "pod", leader, "--grace-period=0", "--force")
            await system.mini.wait("another controller holding the Lease", lambda: system.obj(
                "coordination.k8s.io", "leases", "nezha-controller")["spec"]["holderIdentity"] not in (None, leader),
                timeout=60)
            await system.run(*system.kubectl, "-n", NS, "scale", "statefulset", "nezha-cache", "--replicas=3")
            three = {f"nezha-cache-{i}" for i in range(3)}
            await system.mini.wait("a ring of three under the new leader",
                                   lambda: _members(ring_of(system), three), timeout=60)
            for p in [CIFAR, *paths]:
                assert await fetch(http, system.service_ip("nezha-cache"), p) == system.origin.files[p]
    finally:
        await kube.close()


async def fetch(http: aiohttp.ClientSession, address: str, path: str) -> bytes:
    """GET as a pod whose hostAliases point the dataset host at `address` sends it."""
    async with http.get(f"http://{address}{path}", headers={"Host": "www.cs.toronto.edu"}) as r:
        assert r.status == 200, f"{address}{path}: {r.status} {await r.text()}"
        return await r.read()


async def _all_on(http: aiohttp.ClientSession, system, names: set[str], epoch: int) -> bool:
    for name in names:
        run = system.mini.runs.get((NS, name))
        if run is None:
            return False
        try:
            async with http.get(f"http://{run.ip}:{run.ports['http']}/readyz") as r:
                if (await r.json())["ring_epoch"] != epoch:
                    return False
        except (aiohttp.ClientError, OSError, ValueError):
            return False
    return True


async def _all_held(system, keys: list[str], copies: int) -> bool:
    index = Index(redis_url=system.redis_url(), node_id=None)
    try:
        held = [len(await index.locations(k)) for k in keys]
        return all(n >= copies for n in held)
    finally:
        await index.close()


async def _members(ring, expected: set[str]) -> bool:
    _, nodes = await ring
    return set(nodes) == expected


async def test_a_killed_cache_node_is_restarted_rejoins_and_nothing_is_lost(system):
    """SIGKILL of a node process (a crash, an OOM kill): the kubelet restarts it, the other owner serves meanwhile."""
    paths = [f"/datasets/part-{i:02d}.bin" for i in range(12)]
    for p in paths:
        system.origin.put(p, hashlib.sha256(p.encode()).digest() * 2048)
    three = {f"nezha-cache-{i}" for i in range(3)}
    await system.mini.wait("a ring of the three cache pods", lambda: _members(ring_of(system), three), timeout=60)
    async with aiohttp.ClientSession() as http:
        for p in paths:
            assert await fetch(http, system.service_ip("nezha-cache"), p) == system.origin.files[p]
        fetched = {p: system.origin.requests[p] for p in paths}
        # Both owners of every object hold it (as the index records) before the crash, as in a
        # cluster that has been serving a while; a copy still on its way is what a crash may lose.
        keys = [cache_key(parse_target(p, "www.cs.toronto.edu")) for p in paths]
        await system.mini.wait("two holders of every object", lambda: _all_held(system, keys, 2), timeout=30)
        victim = system.mini.run_of("nezha-cache-1")
        restarts = victim.restarts
        os.killpg(victim.proc.pid, signal.SIGKILL)
        await system.mini.wait("the ring without the killed node",
                               lambda: _members(ring_of(system), three - {"nezha-cache-1"}), timeout=30)
        for p in paths:  # served by the other owner of each key, the origin not asked again
            assert await fetch(http, system.service_ip("nezha-cache"), p) == system.origin.files[p]
        await system.mini.wait("the node restarted and back in the ring",
                               lambda: _members(ring_of(system), three), timeout=60)
        assert victim.restarts == restarts + 1
        for p in paths:  # its disk survived the crash: entering through it, every object is there
            assert await fetch(http, f"{victim.ip}:{victim.ports['http']}", p) == system.origin.files[p]
        assert {p: system.origin.requests[p] for p in paths} == fetched


async def test_with_https_terminate_a_labelled_jobs_https_download_is_served_and_cached(https_system, request):
    """The chart's HTTPS wiring, all of it from its own specs: the CA Job makes the CA in the double, cache
    pods mount its key and terminate TLS, the controller copies the bundle into the Job's namespace, and the
    webhook gives the pod the volume and variables Debian's wget (WGETRC) needs. Cold, then warm."""
    system = https_system
    payload = os.urandom(2_000_000)
    system.origin.put(CIFAR, payload)
    url = f"https://www.cs.toronto.edu{CIFAR}"
    kube = system.api.client()
    try:
        await chart_is_up(system)
        bundle = await system.mini.wait("the controller's copy of nezha-ca in the Job's namespace",
                                        lambda: system.obj("", "configmaps", "nezha-ca", ns="ml"), timeout=60)
        files = system.root / "nezha-ca-volume"  # what kubelet puts in a pod's nezha-ca volume
        files.mkdir()
        for key, value in bundle["data"].items():
            (files / key).write_text(value)
        ca_dir = mount_point(request, Path("/etc/nezha/ca"))
        for name, origin_requests in (("secure-cold", 1), ("secure-warm", 1)):
            await client.BatchV1Api(kube).create_namespaced_job("ml", training_job(name, url, rule_label(system)))
            pod = await system.mini.wait(f"the pod of Job {name}", lambda: next(
                (p for (ns, _), p in system.api.objects_of("", "pods").items()
                 if ns == "ml" and p["metadata"]["labels"].get("job-name") == name), None), timeout=10)
            env = container_env(pod)
            assert env["WGETRC"] == "/etc/nezha/ca/wgetrc" and env["SSL_CERT_FILE"] == "/etc/nezha/ca/ca-bundle.crt"
            workdir = system.root / "jobs" / name
            await run_pod_command(pod, workdir, env=env, mounts={str(ca_dir): files}, context=system.mini.logs())
            assert (workdir / Path(url).name).read_bytes() == payload
            assert system.origin.requests[CIFAR] == origin_requests
    finally:
        await kube.close()


async def _at_least(stats, **least: int) -> bool:
    got = await stats
    return all(got[k] >= v for k, v in least.items())


def sidecar_job(system, name: str, url: str, *, program: str = "wget -O") -> dict:
    """A labelled Job that chooses the sidecar model, whose unmodified wget (or curl) reads the same file twice
    (two epochs)."""
    job = training_job(name, url, rule_label(system))
    template = job["spec"]["template"]
    template["metadata"]["annotations"] = {"nezha.io/deployment": "sidecar"}
    template["spec"]["containers"][0]["command"] = [
        "sh", "-c", f"{program} epoch-1 {url} && {program} epoch-2 {url}"]
    return job


async def cluster_requests(system) -> dict[str, int]:
    """nezha:stats:cluster: each request that entered the cluster tier counted once, by the node it reached."""
    from redis.asyncio import Redis

    from nezha.index.schema import KEY_CLUSTER_STATS

    redis = Redis.from_url(system.redis_url(), decode_responses=True)
    try:
        stats = {k: int(v) for k, v in (await redis.hgetall(KEY_CLUSTER_STATS)).items() if v.isdigit()}
    finally:
        await redis.aclose()
    return {"misses": stats.get("misses", 0), "hits": stats.get("hits", 0) + stats.get("peer_hits", 0)}


def served(logs: list[Path], path: str) -> list[dict]:
    """The request_completed events of these pods' logs for `path`, in order."""
    out = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if '"request_completed"' in line and path in line:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


async def webhooks_know_the_server_version(system) -> None:
    """Every webhook pod has read /version (until then it gives sidecar pods the centralized model)."""
    def known() -> bool:
        logs = [system.mini.root / "logs" / f"{n}.log" for (_, n), r in system.mini.runs.items()
                if n.startswith("nezha-webhook-") and not n.startswith("nezha-webhook-certs") and not r.done]
        return bool(logs) and all(log.exists() and '"server_version"' in log.read_text() for log in logs)

    await system.mini.wait("the webhook pods to read the server's version", known, timeout=30)


async def run_sidecar_job(system, kube, name: str, url: str, **kw) -> tuple[dict, Path]:
    """Create the Job; the minicluster's kubelet runs its pod (the webhook's sidecar, then wget); wait for Complete."""
    await client.BatchV1Api(kube).create_namespaced_job("ml", sidecar_job(system, name, url, **kw))
    pod = await system.mini.wait(f"the pod of Job {name}", lambda: next(
        (p for (ns, _), p in system.api.objects_of("", "pods").items()
         if ns == "ml" and p["metadata"]["labels"].get("job-name") == name), None), timeout=10)
    annotations = pod["metadata"].get("annotations") or {}
    assert annotations.get("nezha.io/status") == "sidecar", f"{annotations}; admission: {system.api.admission_calls[-2:]}"
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["nezha-cache"]
    assert pod["spec"]["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["www.cs.toronto.edu"]}]
    ended = await system.mini.wait(f"Job {name} to end", lambda: next((
        c["type"] for c in ((system.obj("batch", "jobs", name, ns="ml") or {}).get("status") or {}).get("conditions")
        or [] if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"), None), timeout=90)
    assert ended == "Complete", system.mini.logs()
    pod = system.obj("", "pods", pod["metadata"]["name"], ns="ml")
    assert pod["status"]["phase"] == "Succeeded"
    return pod, system.mini.root / "pods" / pod["metadata"]["name"]


async def test_a_sidecar_job_reads_its_second_epoch_from_its_own_disk_and_survives_the_cluster_at_zero(
        named_origin_system):
    """The issue's whole-system test: the chart's webhook gives a labelled Job that chooses `sidecar` a native
    sidecar (the Nezha image, `nezha cache` on the pod's loopback, the cluster Service as parent); its first read
    fills the sidecar from the cluster (the origin asked once), the second is served from the sidecar's disk (the
    cluster not asked); a second Job's sidecar gets it from the cluster without the origin; with the cache
    StatefulSet scaled to 0, a third still downloads it, from the origin; every Job completes. The origin's
    upstream is its own name, as in the chart's defaults, which the pod's hostAliases map to the sidecar: the
    sidecar reaches the real origin through an /etc/hosts of its own."""
    system = named_origin_system
    payload = os.urandom(2_000_000)
    system.origin.put(CIFAR, payload)
    url = f"http://www.cs.toronto.edu{CIFAR}"
    system.mini.namespaces.add("ml")  # the kubelet runs the Jobs' pods too: their sidecars are processes
    kube = system.api.client()
    try:
        await chart_is_up(system)
        await webhooks_know_the_server_version(system)

        # 1. Two epochs in one pod: the cluster asked once (and the origin through it), then the sidecar's disk.
        pod, where = await run_sidecar_job(system, kube, "epochs", url)
        for epoch in ("epoch-1", "epoch-2"):
            assert (where / "work" / epoch).read_bytes() == payload
        assert system.origin.requests[CIFAR] == 1
        # The sidecar's own account: the first read a miss (filled from its parent), the second a hit from its
        # disk, which a fresh object is served from without asking anyone (a revalidation would say so).
        sidecar_log = system.mini.root / "logs" / f"{pod['metadata']['name']}.nezha-cache.log"
        assert [e.get("cache") for e in served([sidecar_log], CIFAR)] == ["miss", "hit"], sidecar_log.read_text()

        # 2. Another Job's sidecar starts empty and fills from the cluster, which has it: the origin is not asked.
        pod, where = await run_sidecar_job(system, kube, "from-cluster", url)
        assert (where / "work" / "epoch-1").read_bytes() == payload
        assert system.origin.requests[CIFAR] == 1
        sidecar_log = system.mini.root / "logs" / f"{pod['metadata']['name']}.nezha-cache.log"
        assert [e.get("cache") for e in served([sidecar_log], CIFAR)] == ["miss", "hit"]
        # The cluster's account (its index counts each request once, where it entered, in batches): the first
        # Job's miss and the second Job's hit, and nothing for the first Job's second epoch.
        await system.mini.wait("both Jobs' requests in nezha:stats:cluster", lambda: _at_least(
            cluster_requests(system), misses=1, hits=1), timeout=20)
        assert await cluster_requests(system) == {"misses": 1, "hits": 1}

        # 3. The cluster tier scaled to 0: a sidecar Job still downloads, from the origin itself.
        await system.run(*system.kubectl, "-n", NS, "scale", "statefulset", "nezha-cache", "--replicas=0")
        await system.mini.wait("no cache pods", lambda: not any(
            ns == NS and n.startswith("nezha-cache-") for (ns, n) in system.api.objects_of("", "pods")), timeout=90)
        _, where = await run_sidecar_job(system, kube, "cluster-down", url)
        assert (where / "work" / "epoch-1").read_bytes() == payload
        assert system.origin.requests[CIFAR] == 2
    finally:
        await kube.close()


async def test_https_through_a_sidecar_reaches_the_terminating_cluster_tier_and_curl_trusts_the_nezha_ca(
        https_system):
    """With https.terminate, a sidecar Job's unmodified curl (trusting the Nezha CA bundle the webhook mounts)
    fetches https:// twice: the sidecar's :443 passes each connection, by its server name, to the cluster's :443,
    which terminates it with a certificate of the Nezha CA and serves and caches the object. No CA key is in
    the training pod."""
    system = https_system
    require_tool("curl")  # the Job's program, run by the minicluster's kubelet from PATH
    payload = os.urandom(1_500_000)
    system.origin.put(CIFAR, payload)
    url = f"https://www.cs.toronto.edu{CIFAR}"
    system.mini.namespaces.add("ml")
    kube = system.api.client()
    try:
        await chart_is_up(system)
        await webhooks_know_the_server_version(system)
        await system.mini.wait("the controller's copy of nezha-ca in the Job's namespace",
                               lambda: system.obj("", "configmaps", "nezha-ca", ns="ml"), timeout=60)
        pod, where = await run_sidecar_job(system, kube, "secure-epochs", url, program="curl -sSf -o")
        for epoch in ("epoch-1", "epoch-2"):
            assert (where / "work" / epoch).read_bytes() == payload
        assert system.origin.requests[CIFAR] == 1  # the cluster tier terminated, filled once and served the rest
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["CURL_CA_BUNDLE"] == "/etc/nezha/ca/ca-bundle.crt"
        assert not any("secret" in v for v in pod["spec"]["volumes"]), pod["spec"]["volumes"]  # no CA key here
        sidecar_log = (system.mini.root / "logs" / f"{pod['metadata']['name']}.nezha-cache.log").read_text()
        assert CIFAR not in sidecar_log  # passed through: the sidecar saw a TLS connection, never the request
    finally:
        await kube.close()
