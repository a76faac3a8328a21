"""A presigned URL is a bearer credential: it never reaches the node's disk,
its log or a key, whatever the origin's settings (issue 22's two defects).

The URLs are signed by unmodified boto3 (SigV4 and SigV2 query auth); the
origin here does not verify them, it only counts what it sends.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import boto3
import pytest
from aiohttp import web
from botocore.config import Config

from tests.integration.cachenode.conftest import HOST

ACCESS_KEY = "AKIANEZHATESTKEY0042"
SECRET_KEY = "nezha-test-secret-0042/abcdefghijklmnopqrstu"
TOKEN = "nezha-test-session-token-0042"
BODY = b"dataset bytes " * 2000


def presigned(version: str, expires: int) -> str:
    """boto3's presigned GET of s3://datasets/train.bin, path-style, on HOST."""
    s3 = boto3.client("s3", endpoint_url=f"http://{HOST}", region_name="us-east-1",
                      aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, aws_session_token=TOKEN,
                      config=Config(signature_version=version, s3={"addressing_style": "path"}))
    return s3.generate_presigned_url("get_object", Params={"Bucket": "datasets", "Key": "train.bin"},
                                     ExpiresIn=expires)


def secrets_of(url: str) -> list[str]:
    """What must never be written down: the signature, the access key id, the token."""
    raw = dict(pair.split("=", 1) for pair in urlsplit(url).query.split("&"))
    decoded = dict(parse_qsl(urlsplit(url).query))
    name = "X-Amz-Signature" if "X-Amz-Signature" in raw else "Signature"
    return [raw[name], decoded[name], ACCESS_KEY, TOKEN]


@pytest.fixture
async def s3_like(aiohttp_server):
    """An origin that answers every signed URL of /datasets/train.bin, counting bodies sent."""
    sent: Counter[str] = Counter()

    async def get(request: web.Request) -> web.Response:
        sent[request.path] += 1
        return web.Response(body=BODY, headers={"ETag": '"v1"', "Cache-Control": "max-age=600",
                                                "Content-Type": "application/octet-stream"})

    app = web.Application()
    app.router.add_get("/datasets/train.bin", get)
    server = await aiohttp_server(app, host="127.0.0.1")
    return str(server.make_url("")).rstrip("/"), sent


async def fetch(session: aiohttp.ClientSession, port: int, url: str) -> tuple[int, str, bytes]:
    parts = urlsplit(url)
    async with session.get(f"http://127.0.0.1:{port}{parts.path}?{parts.query}",
                           headers={"Host": HOST}) as r:
        return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read()


@pytest.mark.parametrize("version", ["s3v4", "s3"])
async def test_a_presigned_url_is_passed_through_and_nothing_of_it_is_kept(s3_like, node_process, session,
                                                                             version):
    """With the origin's defaults its signature would be part of the key: the
    request goes to the origin as sent, and no byte of it is stored or logged."""
    upstream, sent = s3_like
    node = node_process(upstream)
    await node.ready(session)
    urls = [presigned(version, expires) for expires in (600, 601)]
    for url in urls:
        status, cache, got = await fetch(session, node.port, url)
        assert (status, cache) == (200, "bypass") and got == BODY
    assert sent["/datasets/train.bin"] == 2
    assert not [p for p in node.data_dir.rglob("*") if p.suffix in (".meta", ".obj")], \
        "a response to a presigned URL was stored"
    written = "".join(node.written().values())
    assert "/datasets/train.bin" in written  # the request was logged...
    for url in urls:
        for secret in secrets_of(url):
            assert secret not in written  # ...without its credentials


@pytest.mark.parametrize("version,volatile", [
    ("s3v4", ["X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
              "X-Amz-Signature", "X-Amz-Security-Token"]),
    ("s3", ["AWSAccessKeyId", "Signature", "Expires", "x-amz-security-token"]),
])
async def test_signature_parameters_declared_volatile_share_one_copy_and_are_never_written(
        s3_like, node_process, session, tmp_path, version, volatile):
    """An operator who declares a URL's signature volatile says it does not
    decide who may read (a public dataset behind a signing CDN): re-signed
    URLs share one stored copy, and still no credential is written down."""
    upstream, sent = s3_like
    config = tmp_path / "nezha.yaml"
    config.write_text(f"origins:\n  - host: {HOST}\n    upstream: {upstream}\n    volatile_params: {volatile}\n")
    node = node_process(None, args=("--config", str(config)))
    await node.ready(session)
    urls = [presigned(version, expires) for expires in (600, 601, 602)]
    outcomes = []
    for url in urls:
        status, cache, got = await fetch(session, node.port, url)
        assert status == 200 and got == BODY
        outcomes.append(cache)
    assert outcomes[0] == "miss" and outcomes[1:] == ["hit", "hit"]
    assert sent["/datasets/train.bin"] == 1
    [meta] = [p for p in node.data_dir.rglob("*") if p.suffix in (".meta", ".obj")]
    assert b"/datasets/train.bin" in meta.read_bytes()
    written = "".join(node.written().values())
    for url in urls:
        for secret in secrets_of(url):
            assert secret not in written
