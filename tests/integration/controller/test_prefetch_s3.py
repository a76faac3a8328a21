"""nezha.io/prefetch of `s3://BUCKET/PREFIX` against a real S3 server (SeaweedFS's `weed mini`).

The controller lists the prefix with ListObjectsV2, path-style through the
origin the table names for S3 (`s3.amazonaws.com`, whose upstream here is
a counting relay in front of weed), page after page, and has the node fill
every key under the https URL a boto3 client with `AWS_ENDPOINT_URL_S3`
reads. The relay counts what the origin sent: each object once. Jobs and
Secrets are made with the real kubectl.
"""

from __future__ import annotations

import base64
import os

import aiohttp
import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from kubernetes_asyncio import client

from nezha.config import Origin
from nezha.prefetch.sigv4 import EMPTY_SHA256
from testkit.relay import CountingRelay
from testkit.s3_server import S3Identity, S3Server, weed_executable
from tests.integration.controller.conftest import STS, ring_becomes
from tests.integration.controller.test_prefetch import job_done, training_job
from tests.integration.controller.test_prefetch_names import read_as_a_tls_client

S3 = "s3.amazonaws.com"
ADMIN = S3Identity("admin", "AKNEZHAADMIN00000001", "nezha-admin-secret-0001/abcdEFGHijklMNOP",
                   ("Read:public", "Write:public", "List:public", "Read:private", "Write:private", "List:private"))
READER = S3Identity("reader", "AKNEZHAREADER0000001", "nezha-reader-secret-0001/abcdEFGHijklMNOP",
                    ("Read:private", "List:private"))
CLUSTER_TOKEN = "nezha-test-cluster-token-0001"
# SeaweedFS's anonymous identity: what a request without a signature may do.
ANONYMOUS = S3Identity("anonymous", "AKNEZHAANONYMOUS0001", "unused-anonymous-secret/abcdEFGHijklMNOP",
                       ("Read:public", "List:public"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(weed_executable(), tmp_path_factory.mktemp("weed"), identities=[ADMIN, ANONYMOUS, READER],
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


@pytest.fixture
def s3_private(s3):
    return s3


def s3_origins(s3) -> list[Origin]:
    upstream = f"http://127.0.0.1:{s3.relay.port}"
    return [Origin(host=S3, upstream=upstream, tls_upstream=upstream)]


async def test_an_s3_prefix_of_several_pages_is_listed_whole_and_each_key_filled_once(
        kube, ns, cluster, run_controller, index, s3, one_node, kubectl):
    bodies = {f"train/shard-{i:02d}.bin": os.urandom(100_000) for i in range(5)}
    for key, body in bodies.items():
        s3.admin.put_object(Bucket="public", Key=key, Body=body)
    s3.admin.put_object(Bucket="public", Key="test/shard-00.bin", Body=b"not under the prefix")
    listener = await one_node(s3_origins(s3))
    before = s3.relay.down
    await run_controller(peer_address="pod-ip", origins=s3_origins(s3), s3_page_keys=2)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    batch = client.BatchV1Api(kube)
    await kubectl.create(training_job("imagenet", "s3://public/train/"))
    status, events = await job_done(batch, cluster.core, ns, "imagenet", timeout=20)
    assert status == {"total": 5, "done": 5, "failed": [], "bytes": 500_000, "pinned": 500_000,
                      "expanded_from": [{"name": "s3://public/train/", "objects": 5}]}
    sent = s3.relay.down - before
    # Each object once, plus three listing pages and the answers' heads: far less than a second copy.
    assert 500_000 <= sent < 540_000, sent

    before = s3.relay.down
    for key, body in bodies.items():
        got, cache = await read_as_a_tls_client(listener, f"https://{S3}/public/{key}")
        assert got == body and cache == "hit", (key, cache)
    assert s3.relay.down == before, "a warm read reached the origin"



def secret(name: str, **values: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}


async def relayed(listener, s3, key: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """GET https://s3.amazonaws.com/private/KEY through the node as the TLS port's clients arrive (a peer
    relaying https, with the cluster token), with `headers` of the caller's own."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{listener.port}/private/{key}", headers={
                "Host": S3, "X-Nezha-Peer": "test-reader", "X-Nezha-Scheme": "https",
                "X-Nezha-Token": CLUSTER_TOKEN, **headers}) as r:
            return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read()


def signed_by(identity: S3Identity, url: str) -> dict[str, str]:
    """botocore's own SigV4 of a GET of `url` (the upstream's URL, whose host the node sends on)."""
    request = AWSRequest(method="GET", url=url, headers={"X-Amz-Content-SHA256": EMPTY_SHA256})
    S3SigV4Auth(Credentials(identity.access_key, identity.secret_key), "s3", "us-east-1").add_auth(request)
    return {k: v for k, v in request.headers.items() if k.lower() != "host"}


async def test_a_private_prefix_is_prefetched_with_the_workloads_secret_and_a_caller_without_credentials_is_denied_it(
        kube, ns, cluster, run_controller, index, s3_private, one_node, tmp_path, kubectl):
    s3 = s3_private
    bodies = {f"p/{i}.bin": os.urandom(200_000) for i in range(3)}
    for key, body in bodies.items():
        s3.admin.put_object(Bucket="private", Key=key, Body=body)
    upstream = f"http://127.0.0.1:{s3.relay.port}"
    table = [Origin(host=S3, upstream=upstream, tls_upstream=upstream, credentials="authorize")]
    listener = await one_node(table, cluster_token=CLUSTER_TOKEN)
    token_file = tmp_path / "cluster-token"
    token_file.write_text(CLUSTER_TOKEN)
    await run_controller(peer_address="pod-ip", origins=table, cluster_token_file=token_file, s3_page_keys=2)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)
    batch = client.BatchV1Api(kube)
    await kubectl.create(secret("s3-reader", AWS_ACCESS_KEY_ID=READER.access_key,
                                                   AWS_SECRET_ACCESS_KEY=READER.secret_key))

    before = s3.relay.down
    private = training_job("private-train", "s3://private/p/")
    private["metadata"]["annotations"]["nezha.io/prefetch-secret"] = "s3-reader"
    await kubectl.create(private)
    status, events = await job_done(batch, cluster.core, ns, "private-train", timeout=20)
    assert status == {"total": 3, "done": 3, "failed": [], "bytes": 600_000, "pinned": 600_000,
                      "expanded_from": [{"name": "s3://private/p/", "objects": 3}]}, (status, events)
    assert 600_000 <= s3.relay.down - before < 640_000, "each object once"

    # Without the Secret the listing itself is refused by S3: nothing is asked for.
    await kubectl.create(training_job("no-secret", "s3://private/p/"))
    status, events = await job_done(batch, cluster.core, ns, "no-secret", timeout=20)
    assert status["done"] == 0 and "403" in status["failed"][0]["reason"]
    assert any(e.type == "Warning" and "s3://private/p/" in e.message for e in events)

    for key, body in bodies.items():
        before = s3.relay.down
        # A caller without credentials: the origin refuses it, and no byte of the stored copy reaches it.
        status_code, cache, got = await relayed(listener, s3, key, {})
        assert (status_code, cache) == (403, "denied") and body[:64] not in got
        # The reader, with a signature of its own: the stored copy, after S3's 304.
        status_code, cache, got = await relayed(listener, s3, key, signed_by(READER, f"{upstream}/private/{key}"))
        assert (status_code, cache, got == body) == (200, "authorized", True)
        assert s3.relay.down - before < 8192, "a warm read cost the origin more than its answers' heads"


async def test_a_secret_that_is_missing_or_holds_no_known_key_fetches_nothing_and_says_why(
        kube, ns, cluster, run_controller, index, s3_private, one_node, kubectl):
    s3 = s3_private
    upstream = f"http://127.0.0.1:{s3.relay.port}"
    table = [Origin(host=S3, upstream=upstream, tls_upstream=upstream, credentials="authorize")]
    listener = await one_node(table)
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)
    batch = client.BatchV1Api(kube)
    await kubectl.create(secret("wrong-keys", PASSWORD="hunter2"))
    before = s3.relay.down
    for job, name in (("missing", "absent"), ("wrong", "wrong-keys"), ("bad-name", "Not_A_Name")):
        spec = training_job(job, "s3://private/p/")
        spec["metadata"]["annotations"]["nezha.io/prefetch-secret"] = name
        await kubectl.create(spec)
    reasons = {}
    for job in ("missing", "wrong", "bad-name"):
        status, _ = await job_done(batch, cluster.core, ns, job)
        assert status["done"] == 0 and status["total"] == 1
        reasons[job] = status["failed"][0]["reason"]
    assert f"secret {ns}/absent: not found" in reasons["missing"]
    assert "none of HF_TOKEN" in reasons["wrong"] and "PASSWORD" in reasons["wrong"] and "hunter2" not in reasons["wrong"]
    assert "is not a Secret name" in reasons["bad-name"]
    assert s3.relay.down == before, "nothing was asked of the origin"
