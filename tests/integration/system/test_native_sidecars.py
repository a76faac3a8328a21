"""The minicluster's kubelet runs native sidecars as Kubernetes does (KEP-753), so the whole-system test can run
pods the webhook gave a sidecar: restartable init containers first, the main containers once the sidecar's startup
probe passes, a crashed sidecar restarted, and after the main containers exit the sidecars stopped (SIGTERM, then
SIGKILL when the grace period is over) and the Job completed. Pods of plain shell commands, through the API double's
own Job controller."""

from __future__ import annotations

import pytest

from testkit.kubeapi.kubeconfig import kubeconfig
from testkit.kubeapi.server import KubeAPI
from testkit.tools import require_tool
from tests.integration.system.conftest import need_root
from tests.integration.system.minicluster import MiniCluster
from tests.pod_command import cover_for_hosts

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def cluster(tmp_path, request):
    need_root()
    require_tool("unshare")
    cover_for_hosts(request)  # the pods' /etc/hosts is bound over the machine's, which a bare root lacks
    api = KubeAPI(bookmark_interval=0.2)
    await api.start()
    mini = MiniCluster(api=api, namespace="ml", root=tmp_path / "cluster",
                       kubeconfig=kubeconfig(tmp_path / "kubeconfig", api.url), entrypoints={})
    kube = api.client()
    from kubernetes_asyncio import client
    await client.CoreV1Api(kube).create_namespace({"metadata": {"name": "ml"}})
    await mini.start()
    try:
        yield api, mini, kube
        assert not mini.problems, mini.problems
    finally:
        await kube.close()
        await mini.stop()
        await api.stop()


def job(name: str, *, sidecar: str, main: str, grace: int = 1) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
                "initContainers": [{"name": "cache", "image": "busybox", "restartPolicy": "Always",
                                    "command": ["sh", "-c", sidecar],
                                    "startupProbe": {"exec": {"command": ["sh", "-c", "test -f ready"]},
                                                     "periodSeconds": 1, "failureThreshold": 60}}],
                "containers": [{"name": "train", "image": "busybox", "command": ["sh", "-c", main]}]}}}}


async def finished(api, mini, kube, name: str) -> tuple[dict, dict, list]:
    from kubernetes_asyncio import client
    await client.BatchV1Api(kube).create_namespaced_job("ml", job_specs[name])
    done = await mini.wait(f"Job {name} complete", lambda: any(
        c.get("type") == "Complete" and c.get("status") == "True"
        for c in (((api.objects_of("batch", "jobs").get(("ml", name)) or {}).get("status") or {})
                  .get("conditions") or [])), timeout=60)
    assert done
    pod = next(p for (ns, _), p in api.objects_of("", "pods").items() if p["metadata"]["labels"].get("job-name") == name)
    work = mini.root / "pods" / pod["metadata"]["name"] / "work"
    return pod, work, [(c, what) for p, c, what in mini.events if p == pod["metadata"]["name"]]


job_specs = {
    # A sidecar that becomes ready after a while and ignores SIGTERM; the main container checks it is up.
    "stubborn": job("stubborn", sidecar="trap 'echo term >> term.log' TERM; sleep 1; touch ready; "
                                        "while :; do sleep 0.1; done",
                    main="test -f ready && echo ran > main.out"),
    # A sidecar that crashes once (the kubelet starts it again), then serves, and exits on SIGTERM.
    "crashing": job("crashing", sidecar="if ! test -f crashed; then touch crashed; exit 3; fi; touch ready; "
                                        "trap 'exit 0' TERM; while :; do sleep 0.1; done",
                    main="test -f ready && echo ran > main.out", grace=30),
    # A sidecar whose first run never passes its startup probe: the kubelet kills it and starts it again.
    "slow": job("slow", sidecar="if test -f once; then touch ready; else touch once; fi; "
                                "trap 'exit 0' TERM; while :; do sleep 0.1; done",
                main="test -f ready && echo ran > main.out", grace=30),
}
job_specs["slow"]["spec"]["template"]["spec"]["initContainers"][0]["startupProbe"]["failureThreshold"] = 2


async def test_main_containers_start_after_the_sidecars_startup_probe_and_a_stubborn_sidecar_is_killed(cluster):
    api, mini, kube = cluster
    pod, work, events = await finished(api, mini, kube, "stubborn")
    assert events == [("cache", "started"), ("cache", "startup-passed"), ("train", "started"), ("train", "exited 0"),
                      ("cache", "SIGTERM"), ("cache", "SIGKILL")]
    assert (work / "main.out").read_text() == "ran\n"  # the main container saw the sidecar ready
    assert "term" in (work / "term.log").read_text()  # it got SIGTERM first, and ignored it
    assert pod["status"]["phase"] == "Succeeded"
    job_status = api.objects_of("batch", "jobs")[("ml", "stubborn")]["status"]
    assert job_status["succeeded"] == 1


async def test_a_crashed_sidecar_is_restarted_and_one_that_honours_sigterm_is_not_killed(cluster):
    api, mini, kube = cluster
    pod, work, events = await finished(api, mini, kube, "crashing")
    assert events == [("cache", "started"), ("cache", "exited 3"), ("cache", "started"), ("cache", "startup-passed"),
                      ("train", "started"), ("train", "exited 0"), ("cache", "SIGTERM")]
    assert pod["status"]["phase"] == "Succeeded"
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    assert statuses["cache"]["restartCount"] == 1 and statuses["cache"]["state"]["terminated"]["exitCode"] == 0


async def test_a_sidecar_that_fails_its_startup_probe_is_killed_and_started_again_before_the_main_containers(
        cluster):
    api, mini, kube = cluster
    pod, work, events = await finished(api, mini, kube, "slow")
    assert events == [("cache", "started"), ("cache", "startup-failed"), ("cache", "exited -9"), ("cache", "started"),
                      ("cache", "startup-passed"), ("train", "started"), ("train", "exited 0"), ("cache", "SIGTERM")]
    assert (work / "main.out").read_text() == "ran\n"
