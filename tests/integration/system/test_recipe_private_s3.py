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

import boto3
import pytest
import yaml
from botocore.config import Config

from testkit.relay import CountingRelay
from testkit.s3_server import S3Identity, S3Server, weed_executable
from tests.integration.system.conftest import installed_chart
from tests.integration.system.recipe import (RECIPES, answered, blocks, commands, fill, kubectl, logs_of,
                                             requests_of, run_job, stand_in, stats_row, values_of)
from tests.integration.system.test_whole_system import chart_is_up

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
    pod, env, out = await run_job(system, request, job, seen, hosts=[HOST])
    assert env["AWS_ENDPOINT_URL_S3"] == f"https://{HOST}"  # the webhook's, for a tls rule aliasing S3
    assert env["AWS_CA_BUNDLE"] == "/etc/nezha/ca/ca-bundle.crt"
    (logs,) = commands(page["logs"])
    assert answered(logs_of(logs, job, out), page["first-log"]), out
    assert (system.root / "jobs" / pod["metadata"]["name"] / "shard-000.tar").read_bytes() == body
    sent_cold = relay.down

    # 3. Again: S3 allows the read, the bytes come from a cache node's disk.
    for argv in commands(page["rerun"]):
        await kubectl(system, argv, files=files)
    pod, _, out = await run_job(system, request, job, seen, hosts=[HOST])
    assert answered(logs_of(logs, job, out), page["second-log"]), out
    assert (system.root / "jobs" / pod["metadata"]["name"] / "shard-000.tar").read_bytes() == body
    assert sent_cold >= len(body)
    assert relay.down - sent_cold < 4096, relay.down - sent_cold  # a 304 head, not the object

    # The check Job: unsigned, it gets S3's 403 through the cache, and nothing from the disk.
    check = yaml.safe_load(page["check-job"])
    check_file = system.root / "check-private-shard.yaml"
    check_file.write_text(page["check-job"])
    sent_warm = relay.down
    for argv in commands(page["run-check"]):
        if "logs" in argv:
            assert answered(logs_of(argv, check, out), page["check-log"]), out
        else:
            await kubectl(system, argv, files={"check-private-shard.yaml": check_file})
            _, _, out = await run_job(system, request, check, seen, hosts=[HOST])
    assert relay.down - sent_warm < 4096, relay.down - sent_warm  # S3's refusal, not the object

    # The cache's own account, as the page asks for it (the counts reach Redis within seconds).
    async def counted() -> dict[str, str] | None:
        row = await stats_row(system, page["stats"], HOST)
        return row if requests_of(row) >= (1, 1) else None

    row = await system.mini.wait("both reads in nezha stats", counted, timeout=20)
    assert requests_of(row) == (1, 1), row
    assert row["FROM ORIGIN"] == "3.0 MiB", row
