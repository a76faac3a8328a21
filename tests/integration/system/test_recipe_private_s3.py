"""docs/recipes/private-s3.md, followed literally on the whole system.

The chart's values, the Secret, the Job and the check commands are the
page's blocks (tests/integration/system/recipe.py). The chart is installed
with those values into the API double and its pods run as processes
(minicluster.py); the Job's pod is the one admission made, and its own
command runs with the environment, CA volume and hostAliases the webhook
gave it: unmodified boto3 signs for `s3.us-east-1.amazonaws.com`, reaches
a cache node's port 443 through the alias, trusts the Nezha CA through
`AWS_CA_BUNDLE`, and addresses the bucket path-style because the webhook
set `AWS_ENDPOINT_URL_S3`.

S3 is SeaweedFS (`weed mini`, testkit/s3_server.py), which checks SigV4
signatures and bucket rights. It checks a signature against its external
URL first, here `https://s3.us-east-1.amazonaws.com`: the name the job
signed, as AWS would see it. The origin's upstream is a counting relay in
front of it (the one thing changed from the page), so the test sees what
S3 sent for each read.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.config import Config

from testkit.relay import CountingRelay
from testkit.s3_server import S3Identity, S3Server, weed_executable
from tests.integration.system.conftest import NS, installed_chart
from tests.integration.system.podspec import resolve_env
from tests.integration.system.recipe import RECIPES, blocks, commands, fill, stand_in, values_of
from tests.integration.system.test_whole_system import chart_is_up
from tests.pod_command import mount_point, run_pod_command

pytestmark = pytest.mark.timeout(240)

PAGE = RECIPES / "private-s3.md"
HOST = "s3.us-east-1.amazonaws.com"
BUCKET, KEY = "my-datasets", "train/shard-000.tar"
READER = S3Identity("reader", "AKNEZHARECIPE0000001", "nezha-recipe-secret-0001/abcdEFGHijklMNOP",
                    (f"Read:{BUCKET}", f"Write:{BUCKET}", f"List:{BUCKET}"))


@pytest.fixture
async def s3(tmp_path):
    """weed mini holding the bucket, behind a relay that counts what it sends."""
    server = S3Server(weed_executable(), tmp_path / "weed", identities=[READER], buckets=[BUCKET],
                      external_url=f"https://{HOST}")
    server.workdir.mkdir()
    relay = None
    try:
        await asyncio.to_thread(server.start)
        relay = CountingRelay("127.0.0.1", server.port)
        yield server, relay
    finally:
        if relay is not None:
            relay.close()
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def system(tmp_path, request, s3):
    _, relay = s3
    values = stand_in(values_of(blocks(PAGE)["values"]), {HOST: f"http://127.0.0.1:{relay.port}"})
    async for installed in installed_chart(tmp_path, request, values):
        yield installed


def put_object(server: S3Server, body: bytes) -> None:
    """The bucket's content, written straight to weed (not through the cache)."""
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{server.port}", region_name="us-east-1",
                 aws_access_key_id=READER.access_key, aws_secret_access_key=READER.secret_key,
                 config=Config(s3={"addressing_style": "path"}, proxies={})).put_object(
        Bucket=BUCKET, Key=KEY, Body=body)


async def kubectl(system, argv: list[str], *, files: dict[str, Path] | None = None) -> str:
    """A `kubectl ...` line of the page, run against the double; a file it names is the one given. The
    double serves no OpenAPI documents for kubectl's client-side validation (conftest's `helm install`
    says --disable-openapi-validation for the same reason): `apply` is told not to ask for them."""
    assert argv[0] == "kubectl", argv
    args = [str((files or {}).get(a, a)) for a in argv[1:]]
    if "apply" in args:
        args.append("--validate=false")
    return await system.run(*system.kubectl, *args)


async def run_job(system, request, job: dict, seen: set[str]) -> tuple[dict, str]:
    """The pod admission made for `job` (one not in `seen`), its own command run as the kubelet would:
    the pod's hostAliases, its env (Secrets resolved), its nezha-ca volume at /etc/nezha/ca."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    pod = await system.mini.wait(f"the pod of Job {name}", lambda: next(
        (p for (n, pn), p in system.api.objects_of("", "pods").items()
         if n == ns and p["metadata"]["labels"].get("job-name") == name and pn not in seen), None), timeout=10)
    seen.add(pod["metadata"]["name"])
    assert pod["spec"].get("hostAliases") == [{"ip": system.service_ip("nezha-cache"), "hostnames": [HOST]}], \
        f"{pod['spec'].get('hostAliases')}; admission: {system.api.admission_calls[-1:]}"
    container = pod["spec"]["containers"][0]
    secrets = {s["metadata"]["name"]: s for (n, _), s in system.api.objects_of("", "secrets").items() if n == ns}
    env = resolve_env(pod, container, secret=secrets.get, configmap=lambda _: None)
    assert env["AWS_ENDPOINT_URL_S3"] == f"https://{HOST}"  # the webhook's, for a tls rule aliasing S3
    assert env["AWS_CA_BUNDLE"] == "/etc/nezha/ca/ca-bundle.crt"
    volume = system.root / "jobs" / pod["metadata"]["name"] / "nezha-ca"
    volume.mkdir(parents=True)
    for key, value in system.obj("", "configmaps", "nezha-ca", ns=ns)["data"].items():
        volume.joinpath(key).write_text(value)
    out = await run_pod_command(pod, system.root / "jobs" / pod["metadata"]["name"], env=env,
                                mounts={str(mount_point(request, Path("/etc/nezha/ca"))): volume},
                                context=system.mini.logs())
    return pod, out


def logs_of(argv: list[str], job: dict, output: str) -> str:
    """`kubectl -n NS logs job/NAME`, which the double cannot serve: the command's output, once the line
    is checked to name this Job."""
    assert argv == ["kubectl", "-n", job["metadata"]["namespace"], "logs", f"job/{job['metadata']['name']}"], argv
    return output


def answered(output: str, expected: str) -> bool:
    """The Job's log is the page's line, or the same answer relayed by a node that does not own the object
    (`peer-` before the value), as the page says it may be."""
    name, _, value = expected.strip().partition(": ")
    return output.strip() in (expected.strip(), f"{name}: peer-{value}")


def host_row(table: str, host: str) -> dict[str, str]:
    """A row of `nezha stats`' table by its column names (cells are aligned under the header)."""
    header, *rows = table.splitlines()
    names = [n for n in header.split("  ") if n.strip()]
    starts = [header.index(n) for n in names]
    for row in rows:
        cells = [row[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        if cells[:2] == ["host", host]:
            return dict(zip([n.strip() for n in names], cells))
    raise AssertionError(f"no row for host {host}:\n{table}")


async def test_the_private_s3_recipe_caches_a_signed_read_once_and_authorizes_the_next_one(system, s3, request):
    server, relay = s3
    page = blocks(PAGE)
    body = os.urandom(3 * 1024 * 1024)
    await asyncio.to_thread(put_object, server, body)
    job = yaml.safe_load(page["job"])
    job_file = system.root / "read-private-shard.yaml"
    job_file.write_text(page["job"])
    files = {"read-private-shard.yaml": job_file}
    await chart_is_up(system)
    await system.mini.wait("the controller's copy of nezha-ca in the Job's namespace",
                           lambda: system.obj("", "configmaps", "nezha-ca", ns="ml"), timeout=60)

    # 2. The Secret and the Job, as the page types them.
    for argv in commands(fill(page["secret"], {"YOUR_ACCESS_KEY_ID": READER.access_key,
                                               "YOUR_SECRET_ACCESS_KEY": READER.secret_key})):
        await kubectl(system, argv)
    for argv in commands(page["run-job"]):
        await kubectl(system, argv, files=files)
    seen: set[str] = set()
    pod, out = await run_job(system, request, job, seen)
    (logs,) = commands(page["logs"])
    assert answered(logs_of(logs, job, out), page["first-log"]), out
    workdir = system.root / "jobs" / pod["metadata"]["name"]
    assert (workdir / "shard-000.tar").read_bytes() == body
    sent_cold = relay.down

    # 3. Again: S3 allows the read, the bytes come from a cache node's disk.
    for argv in commands(page["rerun"]):
        await kubectl(system, argv, files=files)
    pod, out = await run_job(system, request, job, seen)
    assert answered(logs_of(logs, job, out), page["second-log"]), out
    assert (system.root / "jobs" / pod["metadata"]["name"] / "shard-000.tar").read_bytes() == body
    assert sent_cold >= len(body)
    assert relay.down - sent_cold < 4096, relay.down - sent_cold  # a 304 head, not the object

    # The cache's own account: `kubectl exec` into the pod the page names, its command as typed.
    ((kubectl_, ns_flag, ns, verb, pod_name, dashes, *command),) = commands(page["stats"])
    assert (kubectl_, ns_flag, ns, verb, dashes) == ("kubectl", "-n", NS, "exec", "--")

    async def counted() -> dict[str, str] | None:
        row = host_row(await system.mini.exec(pod_name, command), HOST)
        return row if int(row["HITS"]) + int(row["PEER"]) >= 1 and int(row["MISSES"]) >= 1 else None

    row = await system.mini.wait("both reads in nezha stats", counted, timeout=20)
    assert (int(row["HITS"]) + int(row["PEER"]), int(row["MISSES"])) == (1, 1), row
    assert row["FROM ORIGIN"] == "3.0 MiB", row
