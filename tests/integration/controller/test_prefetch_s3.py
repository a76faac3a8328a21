"""nezha.io/prefetch of `s3://BUCKET/PREFIX` against a real S3 server (SeaweedFS's `weed mini`).

The controller lists the prefix with ListObjectsV2, path-style through the
origin the table names for S3 (`s3.amazonaws.com`, whose upstream here is
a counting relay in front of weed), page after page, and has the node fill
every key under the https URL a boto3 client with `AWS_ENDPOINT_URL_S3`
reads. The relay counts what the origin sent: each object once.
"""

from __future__ import annotations

import os

import boto3
import pytest
from botocore.config import Config
from kubernetes_asyncio import client

from nezha.config import Origin
from testkit.relay import CountingRelay
from testkit.s3_server import S3Identity, S3Server, weed_executable
from tests.integration.controller.conftest import STS, ring_becomes
from tests.integration.controller.test_prefetch import job_done, training_job
from tests.integration.controller.test_prefetch_names import one_node, read_as_a_tls_client  # noqa: F401

S3 = "s3.amazonaws.com"
ADMIN = S3Identity("admin", "AKNEZHAADMIN00000001", "nezha-admin-secret-0001/abcdEFGHijklMNOP",
                   ("Read:public", "Write:public", "List:public", "Read:private", "Write:private", "List:private"))
# SeaweedFS's anonymous identity: what a request without a signature may do.
ANONYMOUS = S3Identity("anonymous", "AKNEZHAANONYMOUS0001", "unused-anonymous-secret/abcdEFGHijklMNOP",
                       ("Read:public", "List:public"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(weed_executable(), tmp_path_factory.mktemp("weed"), identities=[ADMIN, ANONYMOUS],
                      buckets=["public", "private"])
    relay = None
    try:
        server.start()
        relay = CountingRelay("127.0.0.1", server.port)
        server.relay = relay
        server.admin = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{server.port}", region_name="us-east-1",
                                    aws_access_key_id=ADMIN.access_key, aws_secret_access_key=ADMIN.secret_key,
                                    config=Config(s3={"addressing_style": "path"}, proxies={}))
        yield server
    finally:
        if relay is not None:
            relay.close()
        server.stop()


def s3_origins(s3) -> list[Origin]:
    upstream = f"http://127.0.0.1:{s3.relay.port}"
    return [Origin(host=S3, upstream=upstream, tls_upstream=upstream)]


async def test_an_s3_prefix_of_several_pages_is_listed_whole_and_each_key_filled_once(
        kube, ns, cluster, run_controller, index, s3, one_node):  # noqa: F811
    bodies = {f"train/shard-{i:02d}.bin": os.urandom(100_000) for i in range(5)}
    for key, body in bodies.items():
        s3.admin.put_object(Bucket="public", Key=key, Body=body)
    s3.admin.put_object(Bucket="public", Key="test/shard-00.bin", Body=b"not under the prefix")
    listener = await one_node(s3_origins(s3))
    before = s3.relay.down
    await run_controller(peer_address="pod-ip", origins=s3_origins(s3), s3_page_keys=2)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"})

    batch = client.BatchV1Api(kube)
    await batch.create_namespaced_job(ns, training_job("imagenet", "s3://public/train/"))
    status, events = await job_done(batch, cluster.core, ns, "imagenet", timeout=20)
    assert status == {"total": 5, "done": 5, "failed": [], "bytes": 500_000,
                      "expanded_from": [{"name": "s3://public/train/", "objects": 5}]}
    sent = s3.relay.down - before
    # Each object once, plus three listing pages and the answers' heads: far less than a second copy.
    assert 500_000 <= sent < 540_000, sent

    before = s3.relay.down
    for key, body in bodies.items():
        got, cache = await read_as_a_tls_client(listener, f"https://{S3}/public/{key}")
        assert got == body and cache == "hit", (key, cache)
    assert s3.relay.down == before, "a warm read reached the origin"
