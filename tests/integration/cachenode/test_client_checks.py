"""The client can check too: an answer from the cache carries the origin's
digest fields as the origin sent them, and a Want-Repr-Digest is answered
from a digest the node knows (issue 37, item 4; RFC 9530)."""

import base64
import hashlib

import pytest

PATH = "/data/shard-0002.tar"
BODY = b"0123456789abcdef" * 65536
SHA256 = base64.b64encode(hashlib.sha256(BODY).digest()).decode()
FIELDS = {"x-amz-checksum-sha256": SHA256, "x-amz-checksum-type": "FULL_OBJECT",
          "Content-MD5": base64.b64encode(hashlib.md5(BODY).digest()).decode(),
          "x-goog-hash": "md5=" + base64.b64encode(hashlib.md5(BODY).digest()).decode()}


@pytest.mark.parametrize("splice_fills", [True, False])
async def test_miss_hit_and_fast_path_hit_carry_the_origins_digest_fields_as_sent(origin, make_node, session,
                                                                                  splice_fills):
    origin.put(PATH, BODY, headers=FIELDS)
    node = await make_node(splice_fills=splice_fills)
    for expected in ("miss", "hit", "hit"):
        status, headers, body = await node.get(session, PATH)
        assert status == 200 and body == BODY and headers["X-Nezha-Cache"] == expected
        for name, value in FIELDS.items():
            assert headers.getall(name) == [value], (expected, name)
        assert "Repr-Digest" not in headers, "added only when asked for"
        await node.node.settled()
    assert origin.requests[PATH] == 1


async def test_want_repr_digest_is_answered_on_a_miss_a_hit_and_a_range(origin, make_node, session):
    origin.put(PATH, BODY, headers=FIELDS)
    node = await make_node()
    want = {"Want-Repr-Digest": "sha-512=3, sha-256=7"}
    _, miss, _ = await node.get(session, PATH, headers=want)
    await node.node.settled()
    _, hit, _ = await node.get(session, PATH, headers=want)
    status, ranged, body = await node.get(session, PATH, headers={**want, "Range": "bytes=0-9"})
    assert miss["X-Nezha-Cache"] == "miss" and hit["X-Nezha-Cache"] == "hit"
    assert miss["Repr-Digest"] == hit["Repr-Digest"] == ranged["Repr-Digest"] == f"sha-256=:{SHA256}:"
    # A 206 keeps the representation's digest and leaves off those of the whole body.
    assert status == 206 and body == BODY[:10] and "x-amz-checksum-sha256" not in ranged


async def test_want_repr_digest_without_a_known_sha_gets_none(origin, make_node, session):
    origin.put(PATH, BODY, headers={"Content-MD5": FIELDS["Content-MD5"]})
    node = await make_node()
    _, headers, _ = await node.get(session, PATH, headers={"Want-Repr-Digest": "sha-256=1"})
    assert "Repr-Digest" not in headers


async def test_want_repr_digest_is_answered_through_a_relay_too(origin, cluster, session):
    """A non-owner passes the client's Want-Repr-Digest to the owner, whose answer carries Repr-Digest."""
    from tests.integration.cachenode.conftest import owner_and_other

    origin.put(PATH, BODY, headers=FIELDS)
    nodes, _ = await cluster(2)
    owners, others = owner_and_other(nodes, PATH)
    want = {"Want-Repr-Digest": "sha-256=1"}
    for label in ("peer-miss", "peer-hit"):
        status, headers, body = await nodes[others[0]].get(session, PATH, headers=want)
        assert status == 200 and body == BODY and headers["X-Nezha-Cache"] == label
        assert headers["Repr-Digest"] == f"sha-256=:{SHA256}:", label
        assert headers["x-amz-checksum-sha256"] == SHA256
        await nodes[owners[0]].node.settled()
