"""Against a real S3 server: objects boto3 uploaded with a ChecksumAlgorithm
are checked on fill against the checksum S3 returns (issue 37).

SeaweedFS's S3 gateway (`weed mini`, testkit/s3_server.py) keeps the
checksum boto3 sent with the upload and returns it on a GetObject that asks
for it (`x-amz-checksum-mode: ENABLED`, boto3's default). boto3 reads
through the node as its proxy, signing each read; the node's origin is
`credentials: authorize`, so a signed read is a fill of the whole object
(docs/private-objects.md), checked like any other.
"""

from __future__ import annotations

import os
import time

import boto3
import pytest
from botocore.config import Config

from testkit.s3_server import S3Identity, S3Server, weed_executable
from tests.integration.cachenode.conftest import NodeProcess, node_for_localhost

BUCKET = "verified"
USER = S3Identity("reader", "AKNEZHAVERIFY0000001", "nezha-verify-secret-0001/abcdEFGHijklMNOP",
                  (f"Read:{BUCKET}", f"Write:{BUCKET}", f"List:{BUCKET}"))
ALGORITHMS = ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"]


@pytest.fixture(scope="module")
def s3_and_node(tmp_path_factory):
    s3 = S3Server(weed_executable(), tmp_path_factory.mktemp("weed"), identities=[USER], buckets=[BUCKET])
    s3.external_url = f"http://localhost:{s3.port}"  # what clients sign; the node reaches it at 127.0.0.1
    node = None
    try:
        s3.start()
        node = node_for_localhost(tmp_path_factory.mktemp("node"), s3.port, "    credentials: authorize\n")
        yield s3, node
    finally:
        if node is not None:
            node.stop()
        s3.stop()


def client(s3: S3Server, proxy: str | None):
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                    proxies={"http": proxy} if proxy else {})
    # Uploads go to the server by address: a bare CI machine has no /etc/hosts to
    # resolve `localhost`; reads through the node name `localhost`, which the node maps.
    endpoint = s3.external_url if proxy else f"http://127.0.0.1:{s3.port}"
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=USER.access_key, aws_secret_access_key=USER.secret_key, config=config)


def until_event(node: NodeProcess, event: str, key: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in node.events() if e.get("event") == event and e.get("key", "").endswith(f"/{key}")]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"no {event} for {key}: {[e for e in node.events() if key in str(e)][-5:]}"
        time.sleep(0.05)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_object_uploaded_with_a_checksum_is_verified_on_fill(s3_and_node, algorithm):
    s3, node = s3_and_node
    key = f"shards/{algorithm.lower()}.bin"
    body = os.urandom(3 << 20)
    admin = client(s3, None)
    admin.put_object(Bucket=BUCKET, Key=key, Body=body, ChecksumAlgorithm=algorithm)
    direct = admin.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    field = f"x-amz-checksum-{algorithm.lower()}"
    assert field in direct["ResponseMetadata"]["HTTPHeaders"], "the S3 server returns the upload's checksum"
    direct["Body"].read()

    reader = client(s3, f"http://127.0.0.1:{node.port}")
    got = reader.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert got["Body"].read() == body  # boto3 checks the checksum itself too
    assert got["ResponseMetadata"]["HTTPHeaders"][field] == direct["ResponseMetadata"]["HTTPHeaders"][field]
    stored = until_event(node, "fill_completed", key)
    assert stored["verified"] == field and stored["bytes"] == len(body)
    assert not [e for e in node.events() if e.get("event") == "digest_mismatch"]
    again = reader.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert again["Body"].read() == body
    assert again["ResponseMetadata"]["HTTPHeaders"]["x-nezha-cache"] == "authorized"
    assert again["ResponseMetadata"]["HTTPHeaders"][field] == direct["ResponseMetadata"]["HTTPHeaders"][field]


def test_a_multipart_upload_with_a_composite_checksum_is_served_and_not_checked_as_a_whole(s3_and_node):
    """boto3's multipart upload with SHA256: S3's checksum of it is of its
    parts' checksums (`...-N`), which no pass over the bytes reproduces."""
    from boto3.s3.transfer import TransferConfig
    s3, node = s3_and_node
    key = "shards/multipart.bin"
    body = os.urandom(12 << 20)
    admin = client(s3, None)
    path = node.data_dir.parent / "upload.bin"
    path.write_bytes(body)
    admin.upload_file(str(path), BUCKET, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"},
                      Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    direct = admin.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    direct["Body"].read()
    reader = client(s3, f"http://127.0.0.1:{node.port}")
    assert reader.get_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")["Body"].read() == body
    stored = until_event(node, "fill_completed", key)
    assert "verified" not in stored
    [said] = [e for e in node.events() if e.get("event") == "digest_not_checked" and e["key"].endswith(key)]
    assert said["field"] == "x-amz-checksum-sha256" and "composite" in said["reason"]
