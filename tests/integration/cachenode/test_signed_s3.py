"""Real signatures, real clients: boto3 through a node to an S3 server that
verifies them (issue 22; docs/private-objects.md).

The origin is SeaweedFS's S3 gateway (`weed mini`, testkit/s3_server.py): it
checks SigV4 headers, presigned V4 and V2 URLs, their expiry and each
identity's bucket permissions, so a read that succeeds here is one the
origin really allowed. The client is unmodified boto3 (and `requests` for
presigned URLs) using the node as its HTTP proxy: absolute-form requests,
signed for the endpoint's own `Host`, which the node forwards as sent.

    boto3 --proxy--> node (credentials: authorize) --> counting relay --> weed

The origin's name is `localhost`: clients sign for `localhost:<relay port>`
and reach it through the node as a proxy, resolving nothing. The node
fetches from 127.0.0.1:<relay port> (a bare CI machine has no /etc/hosts to
resolve `localhost`), and weed checks signatures against its external URL,
`localhost:<relay port>`, first: what the client signed. The relay counts what the origin sends: a warm read must cost
it an authorisation (a 304 head), not the object.

One weed, one relay and one node serve the whole module (the test of the
default mode starts a second node); each test uses its own objects. The last test reads everything the node wrote, after all the
others, for the credentials they used.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import boto3
import botocore
import pytest
import requests
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from testkit.relay import CountingRelay
from testkit.s3_server import S3Identity, S3Server, weed_executable
from tests.integration.cachenode.conftest import NodeProcess, node_for_localhost

BUCKET = "datasets"
READER = S3Identity("reader", "AKNEZHAREADER0000001", "nezha-reader-secret-0001/abcdEFGHijklMNOP",
                    (f"Read:{BUCKET}", f"Write:{BUCKET}", f"List:{BUCKET}"))
# A valid identity, whose signatures weed accepts, without any right on BUCKET.
STRANGER = S3Identity("stranger", "AKNEZHASTRANGER00002", "nezha-stranger-secret-0002/qrstUVWXyzab",
                      ("Read:elsewhere", "List:elsewhere"))
WRONG_SECRET = "nezha-wrong-secret-0003/CDEFghijKLMNopqr"
FORGED_TOKEN = "nezha-forged-session-token-0004-IQoJb3JpZ2luX2VjEXAMPLE"
MiB = 1 << 20

# Every credential a test hands a client or reads off a request, for the last test.
USED: set[str] = {READER.access_key, READER.secret_key, STRANGER.access_key, STRANGER.secret_key,
                  WRONG_SECRET, FORGED_TOKEN}


@dataclass
class World:
    s3: S3Server
    relay: CountingRelay
    node: NodeProcess
    data_dir: Path
    admin: object = field(repr=False)  # boto3 client straight to weed: puts, not through the node

    @property
    def endpoint(self) -> str:
        """Where clients believe the origin is, and what they sign: localhost:<relay port>."""
        return f"http://localhost:{self.relay.port}"

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.node.port}"

    def client(self, access_key: str | None, secret_key: str | None, *, token: str | None = None,
               signature_version: object = "s3v4", proxied: bool = True):
        """Unmodified boto3, path-style, with the node as its HTTP proxy; every
        signature it sends is recorded in USED."""
        config = Config(signature_version=signature_version, s3={"addressing_style": "path"},
                        retries={"max_attempts": 1},
                        proxies={"http": self.proxy} if proxied else {})
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                              aws_session_token=token, config=config)
        client.meta.events.register("before-send.s3", _record_signature)
        return client

    def presign(self, identity: S3Identity, key: str, *, version: str, expires: int) -> str:
        url = self.client(identity.access_key, identity.secret_key, signature_version=version).generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=expires)
        USED.update(_url_signatures(url))
        return url

    def put(self, key: str, body: bytes) -> None:
        self.admin.put_object(Bucket=BUCKET, Key=key, Body=body)

    def metas(self) -> int:
        return sum(1 for p in self.data_dir.rglob("*") if p.suffix in (".meta", ".obj"))


def _record_signature(request, **_) -> None:
    auth = request.headers.get("Authorization")
    if auth:
        auth = auth.decode() if isinstance(auth, bytes) else auth
        USED.update(re.findall(r"Signature=([0-9a-f]+)", auth))


def _url_signatures(url: str) -> list[str]:
    """A presigned URL's signature as written in it and decoded."""
    raw = dict(pair.split("=", 1) for pair in urlsplit(url).query.split("&"))
    decoded = dict(parse_qsl(urlsplit(url).query))
    name = "X-Amz-Signature" if "X-Amz-Signature" in raw else "Signature"
    return [raw[name], decoded[name]]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    s3 = S3Server(weed_executable(), tmp_path_factory.mktemp("weed"), identities=[READER, STRANGER],
                  buckets=[BUCKET, "elsewhere"])
    relay = node = None
    try:
        relay = CountingRelay("127.0.0.1", s3.port)
        s3.external_url = f"http://localhost:{relay.port}"  # what clients sign: see World.endpoint
        s3.start()
        root = tmp_path_factory.mktemp("node")
        node = node_for_localhost(root, relay.port, "    credentials: authorize\n")
        admin = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3.port}", region_name="us-east-1",
                             aws_access_key_id=READER.access_key, aws_secret_access_key=READER.secret_key,
                             config=Config(s3={"addressing_style": "path"}, proxies={}))
        yield World(s3=s3, relay=relay, node=node, data_dir=root / "data", admin=admin)
    finally:
        if node is not None:
            node.stop()
        if relay is not None:
            relay.close()
        s3.stop()


def read(client, key: str) -> tuple[bytes, str]:
    """GetObject through the node: the bytes and the node's X-Nezha-Cache."""
    r = client.get_object(Bucket=BUCKET, Key=key)
    return r["Body"].read(), r["ResponseMetadata"]["HTTPHeaders"].get("x-nezha-cache", "")


def refused(client, key: str) -> tuple[int, str, str, bytes]:
    """GetObject that must fail: status, error code, X-Nezha-Cache, and the raw body received."""
    raw: list[bytes] = []

    def keep(response_dict, **_) -> None:
        raw.append(response_dict["body"])

    client.meta.events.register("before-parse.s3.GetObject", keep)
    with pytest.raises(ClientError) as e:
        client.get_object(Bucket=BUCKET, Key=key)
    meta = e.value.response["ResponseMetadata"]
    return (meta["HTTPStatusCode"], e.value.response["Error"]["Code"], meta["HTTPHeaders"].get("x-nezha-cache", ""),
            b"".join(raw))


def via_node() -> requests.Session:
    """A plain HTTP client that ignores the environment's proxy settings."""
    s = requests.Session()
    s.trust_env = False
    return s


def fetch(world: World, url: str) -> tuple[int, str, bytes]:
    """GET a presigned URL as written, with the node as proxy (absolute-form)."""
    with via_node() as s:
        r = s.get(url, proxies={"http": world.proxy}, timeout=60)
        return r.status_code, r.headers.get("X-Nezha-Cache", ""), r.content


def test_a_signed_read_fills_cold_then_warm_reads_cost_the_origin_one_authorisation(world):
    body = os.urandom(3 * MiB)
    world.put("cold-warm/shard-0.bin", body)
    reader = world.client(READER.access_key, READER.secret_key)

    before = world.relay.down
    assert read(reader, "cold-warm/shard-0.bin") == (body, "miss")
    assert world.relay.down - before >= len(body)

    for _ in range(3):
        before = world.relay.down
        assert read(reader, "cold-warm/shard-0.bin") == (body, "authorized")
        # The origin answered the probe with a 304 head: a few hundred bytes.
        assert world.relay.down - before < 1024, world.relay.down - before


def _stranger(world):
    return world.client(STRANGER.access_key, STRANGER.secret_key)


def _wrong_secret(world):
    return world.client(READER.access_key, WRONG_SECRET)


def _anonymous(world):
    return world.client(None, None, signature_version=botocore.UNSIGNED)


def _forged_token(world):
    return world.client(READER.access_key, READER.secret_key, token=FORGED_TOKEN)


@pytest.mark.parametrize("caller,code", [
    (_stranger, "AccessDenied"),  # a valid identity with no right on the bucket
    (_wrong_secret, "SignatureDoesNotMatch"),
    (_anonymous, "AccessDenied"),
    (_forged_token, "InvalidAccessKeyId"),  # a session token the origin never issued
], ids=["no-permission", "wrong-secret", "anonymous", "forged-session-token"])
def test_a_caller_the_origin_refuses_gets_its_403_and_no_byte_of_the_warm_object(world, caller, code):
    key = f"refused/{caller.__name__.strip('_')}.bin"
    body = os.urandom(2 * MiB)
    world.put(key, body)
    reader = world.client(READER.access_key, READER.secret_key)
    assert read(reader, key) == (body, "miss")
    assert read(reader, key) == (body, "authorized")

    before = world.relay.down
    status, got_code, cache, raw = refused(caller(world), key)
    assert (status, got_code, cache) == (403, code, "denied")
    assert len(raw) < 2048 and body[:64] not in raw
    assert world.relay.down - before < 4096  # the origin's refusal, not the object

    assert read(reader, key) == (body, "authorized")  # the stored copy is still there for the reader


@pytest.mark.parametrize("version", ["s3v4", "s3"])
def test_an_expired_presigned_url_gets_the_origins_403_and_no_byte_of_the_warm_object(world, version):
    key = f"expired/{version}.bin"
    body = os.urandom(2 * MiB)
    world.put(key, body)
    reader = world.client(READER.access_key, READER.secret_key)
    assert read(reader, key) == (body, "miss")

    url = world.presign(READER, key, version=version, expires=1)
    # Until the origin itself (asked directly, not through the node) says it expired.
    deadline = time.monotonic() + 30
    # By address: a bare machine has no /etc/hosts to resolve `localhost`, and
    # weed checks the signature against its external URL (localhost) first.
    by_address = url.replace("http://localhost:", "http://127.0.0.1:", 1)
    with via_node() as direct:
        while direct.get(by_address, timeout=30).status_code != 403:
            assert time.monotonic() < deadline, "the presigned URL did not expire within 30 s"
            time.sleep(0.2)

    before = world.relay.down
    status, cache, got = fetch(world, url)
    assert (status, cache) == (403, "denied")
    assert b"expired" in got and body[:64] not in got and len(got) < 2048
    assert world.relay.down - before < 4096
    assert read(reader, key) == (body, "authorized")


def test_presigned_urls_signed_anew_share_one_stored_copy_and_the_origin_sends_the_body_once(world):
    key = "presigned/shard-1.bin"
    body = os.urandom(3 * MiB)
    world.put(key, body)
    # Five V4 and five V2 signatures of one GET, each different (their expiry differs).
    urls = [world.presign(READER, key, version=v, expires=600 + i) for v in ("s3v4", "s3") for i in range(5)]
    assert len(set(urls)) == 10

    metas, before = world.metas(), world.relay.down
    answers = [fetch(world, url) for url in urls]
    assert [(status, got == body) for status, _, got in answers] == [(200, True)] * 10
    assert [cache for _, cache, _ in answers] == ["miss"] + ["authorized"] * 9
    assert world.metas() - metas == 1  # one stored copy
    sent = world.relay.down - before
    assert len(body) <= sent < len(body) + 9 * 1024, sent  # the body once, then nine 304 heads


def test_an_object_replaced_at_the_origin_is_read_anew_by_the_next_authorised_read(world):
    key = "replaced/shard-2.bin"
    first, second = os.urandom(2 * MiB), os.urandom(2 * MiB + 17)
    world.put(key, first)
    reader = world.client(READER.access_key, READER.secret_key)
    assert read(reader, key) == (first, "miss")
    assert read(reader, key) == (first, "authorized")

    world.put(key, second)
    # The probe answered 206 with the new ETag: the caller gets the new object, fetched anew.
    assert read(reader, key) == (second, "miss")
    # Once the new copy is stored, it is the one the origin authorises reads of.
    # (A read that comes between the caller's last byte and the new copy's
    # landing still finds the old copy, whose probe says "changed": it fetches
    # the object again. Correct bytes, one more body from the origin.)
    _until_stored(world, key, len(second))
    assert read(reader, key) == (second, "authorized")
    # And a presigned read of it, too, is of the new version.
    status, cache, got = fetch(world, world.presign(READER, key, version="s3v4", expires=600))
    assert (status, cache, got == second) == (200, "authorized", True)


def _until_stored(world: World, key: str, size: int, timeout: float = 30.0, *, event: str = "fill_completed") -> None:
    """Until the node logged `event` (a completed fill, or assembly) of `key` with `size` bytes."""
    deadline = time.monotonic() + timeout
    while not any(e.get("event") == event and e.get("key", "").endswith(f"/{BUCKET}/{key}")
                  and e.get("bytes") == size for e in world.node.events()):
        assert time.monotonic() < deadline, (f"no stored copy of {key} ({size} bytes) within {timeout} s: "
                                             f"{[e for e in world.node.events() if key in e.get('key', '')][-8:]}")
        time.sleep(0.05)


def test_download_file_in_8_mib_signed_ranged_parts_is_kept_part_by_part_and_the_second_is_nearly_free(world):
    """boto3's download_file: a signed HEAD, then signed ranged GETs of 8 MiB
    (its default part size) with If-Match and x-amz-checksum-mode: ENABLED.

    The node can drop neither the signed Range nor ask for the whole object
    without the caller's credentials: the first download's parts go to the
    origin as signed and are kept as parts (`miss`) until the object is
    whole; the second download's parts are each authorised at the origin
    (a 304 head) and served from disk (`authorized`). Both byte-exact: no
    checksum error, and no whole-object checksum on a part."""
    key = "multipart/shard-4.bin"
    body = os.urandom(20 * MiB)  # three parts: 8, 8 and 4 MiB
    world.put(key, body)
    reader = world.client(READER.access_key, READER.secret_key)
    seen: list[tuple[str, int, str | None, str | None, bool]] = []

    def answered(http_response, model, **_) -> None:
        seen.append((model.name, http_response.status_code, http_response.headers.get("x-nezha-cache"),
                     http_response.headers.get("content-range"),
                     any(n.lower().startswith("x-amz-checksum-") and n.lower() != "x-amz-checksum-type"
                         for n in http_response.headers)))

    reader.meta.events.register("after-call.s3", answered)
    parts = [(0, 8 * MiB - 1), (8 * MiB, 16 * MiB - 1), (16 * MiB, len(body) - 1)]
    sent_by_origin = []
    for attempt in range(2):
        target = world.data_dir.parent / f"download-{attempt}.bin"
        before = world.relay.down
        reader.download_file(BUCKET, key, str(target), ExtraArgs={"ChecksumMode": "ENABLED"},
                             Config=TransferConfig(multipart_chunksize=8 * MiB, multipart_threshold=8 * MiB))
        sent_by_origin.append(world.relay.down - before)
        assert target.read_bytes() == body
        target.unlink()
        if attempt == 0:
            _until_stored(world, key, len(body), event="assembly_completed")
    first, second = seen[:4], seen[4:]
    for run, label in ((first, "miss"), (second, "authorized")):
        assert run[0][:4] == ("HeadObject", 200, "pass", None)
        assert sorted(s[:4] for s in run[1:]) == sorted(
            ("GetObject", 206, label, f"bytes {a}-{b}/{len(body)}") for a, b in parts), run
        assert not any(s[4] for s in run[1:]), "a part answered with a whole-object checksum"
    assert sent_by_origin[0] >= len(body)
    # The second: a HEAD and three 304 heads, a few hundred bytes each.
    assert sent_by_origin[1] < 8 * 1024, sent_by_origin


def test_with_credentials_pass_a_signed_read_goes_through_byte_for_byte_and_nothing_is_kept(world, tmp_path):
    """The default mode, as before issue 22: boto3 through a node to a
    verifying server works as `bypass`, signatures intact, and nothing of it
    is stored or logged (a second node, whose origin entry says nothing of
    credentials)."""
    key = "pass-mode/shard-5.bin"
    body = os.urandom(MiB)
    world.put(key, body)
    with _another_node(world, tmp_path) as passing:
        node = passing.node
        reader = passing.client(READER.access_key, READER.secret_key)
        for _ in range(2):
            assert read(reader, key) == (body, "bypass")
        url = passing.presign(READER, key, version="s3v4", expires=600)
        assert fetch(passing, url) == (200, "bypass", body)
        assert refused(passing.client(STRANGER.access_key, STRANGER.secret_key), key)[:3] == (
            403, "AccessDenied", "bypass")
        assert passing.metas() == 0
        written = node.out.read_text() + node.err.read_text()
        assert "request_completed" in written
        assert [s for s in USED if s and s in written] == []


def test_a_large_cold_object_is_filled_with_the_callers_request_alone_never_in_ranges_made_in_its_name(
        world, tmp_path):
    """A node that would fetch a 24 MiB object in four parallel ranges does
    not for an `authorize` origin: the fill is the caller's request as it
    signed it, and range requests in its name are requests it never made."""
    key = "parallel/shard-6.bin"
    body = os.urandom(24 * MiB)
    world.put(key, body)
    with _another_node(world, tmp_path, "    credentials: authorize\n    fill_streams: 4\n"
                                       "    parallel_fill_threshold: 1MiB\n") as other:
        reader = other.client(READER.access_key, READER.secret_key)
        assert read(reader, key) == (body, "miss")
        _until_stored(other, key, len(body))
        assert not [e for e in other.node.events() if e.get("event") == "parallel_fill"]


@contextlib.contextmanager
def _another_node(world: World, tmp_path: Path, entry: str = ""):
    """A second node in front of the same weed, its origin entry `localhost`
    plus the `entry` lines given (none: credentials: pass)."""
    node = node_for_localhost(tmp_path, world.relay.port, entry, config_name="other.yaml")
    try:
        yield World(s3=world.s3, relay=world.relay, node=node, data_dir=tmp_path / "data", admin=world.admin)
    finally:
        node.stop()


def test_after_all_of_it_no_credential_is_on_the_nodes_disk_or_in_its_logs(world):
    """Runs last in this module: the node has seen every credential the tests used."""
    # On its own too: one signed read and one presigned read of each version first.
    key = "last/shard-3.bin"
    body = os.urandom(MiB)
    world.put(key, body)
    reader = world.client(READER.access_key, READER.secret_key)
    assert read(reader, key)[0] == body
    for version in ("s3v4", "s3"):
        assert fetch(world, world.presign(READER, key, version=version, expires=600))[2] == body

    written = world.node.written()
    assert any(p.suffix in (".meta", ".obj") for p in written)
    assert "request_completed" in written[world.node.out]  # the log is there to be read
    secrets = sorted(s for s in USED if s)
    assert len(secrets) > 10  # signatures were recorded, not only the fixed keys
    found = [(str(p), s) for p, text in written.items() for s in secrets if s in text]
    assert found == []
