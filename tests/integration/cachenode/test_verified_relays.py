"""A read relayed through a non-owner is checked against the digest its head
carries, across every resume: an owner that cuts wrong bytes looks to the
relay like an owner dying mid-body, and the rest resumed elsewhere must not
turn the wrong bytes sent before the cut into a cleanly ended body (issue 37,
item 1; docs/cache-node.md, "Verified bytes")."""

from __future__ import annotations

import base64
import hashlib

import aiohttp
import pytest
from structlog.testing import capture_logs

from nezha.ring import Membership
from tests.integration.cachenode.conftest import RangedOrigin, key_of, owner_and_other
from tests.integration.cachenode.test_peers import dying_owner, path_owned_by

HOST = "www.cs.toronto.edu"
GOOD = bytes(range(256)) * 4096  # 1 MiB
WRONG = GOOD[:50_000] + bytes([GOOD[50_000] ^ 0x01]) + GOOD[50_001:]  # the right length, one bit off early
ETAG = '"v1"'


def sha256_header(body: bytes) -> dict[str, str]:
    return {"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(body).digest()).decode()}


def crc64nvme_header(body: bytes) -> dict[str, str]:
    from awscrt import checksums
    return {"x-amz-checksum-crc64nvme": base64.b64encode(checksums.crc64nvme(body).to_bytes(8, "big")).decode()}


# Hashed in a thread behind the relay, and on the event loop as the bytes pass.
DIGESTS = {"sha256": sha256_header, "crc64nvme": crc64nvme_header}


async def read_counting(node, session, path) -> tuple[int, int, bytes, BaseException | None]:
    """(status, body bytes received, the bytes, the error that cut the body or None)."""
    got = bytearray()
    async with session.get(node.url + path, headers={"Host": HOST}) as r:
        try:
            async for chunk in r.content.iter_any():
                got += chunk
        except aiohttp.ClientPayloadError as e:
            return r.status, len(got), bytes(got), e
        return r.status, len(got), bytes(got), None


def relay_mismatches(logs) -> list[dict]:
    return [e for e in logs if e["event"] == "digest_mismatch" and e.get("source") == "relay"]


@pytest.mark.parametrize("replicas", [1, 2])
async def test_a_relayed_read_whose_owner_cuts_wrong_bytes_is_cut_before_the_end_and_the_next_read_is_right(
        origin, cluster, session, replicas):
    """The owner fills wrong bytes, checks them and cuts before the last byte;
    the relay resumes the rest (from the origin by Range with one owner, from
    the next owner with two) and still never ends the body cleanly."""
    nodes, _ = await cluster(replicas + 1, replicas=replicas)
    path = "/d/wrong.bin"
    origin.put(path, WRONG, etag=ETAG, headers=sha256_header(GOOD))
    owners, others = owner_and_other(nodes, path, replicas=replicas)
    entry = nodes[others[0]]
    with capture_logs() as logs:
        status, got, _, error = await read_counting(entry, session, path)
        for node in nodes.values():
            await node.node.settled()
    assert status == 200 and error is not None, (status, got, error)
    assert got < len(GOOD), "the relayed client got the last byte of a wrong body"
    assert any(e["event"] in ("peer_resumed", "origin_resumed") for e in logs)
    [event] = relay_mismatches(logs)
    assert event["origin"] == HOST and event["key"] == key_of(path) and event["peer"] == owners[0]
    assert event["expected"] == "sha256:" + sha256_header(GOOD)["x-amz-checksum-sha256"]
    assert event["got"] == "sha256:" + sha256_header(WRONG)["x-amz-checksum-sha256"]
    assert entry.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1

    # With two owners the next one's fill, led by the relay's resume, is
    # checked against the digest the relay handed on: nothing wrong is stored.
    assert all(key_of(path) not in node.node.store for node in nodes.values())

    origin.put(path, GOOD, etag=ETAG, headers=sha256_header(GOOD))
    status, got, body, error = await read_counting(entry, session, path)
    assert (status, got, error) == (200, len(GOOD), None) and body == GOOD


@pytest.mark.parametrize("digest", list(DIGESTS))
@pytest.mark.parametrize("prefix", ["right", "wrong"])
async def test_a_relayed_body_resumed_from_the_next_owner_is_checked_whole(origin, cluster, session, aiohttp_server,
                                                                           prefix, digest):
    """An owner sends the first 100 kB and drops (as one cutting a wrong fill
    does); the next owner, holding the right bytes, sends the rest. Right
    bytes before the cut: one clean, whole body. Wrong ones: the client is
    cut, never handed the wrong prefix joined to the right rest."""
    nodes, members = await cluster(2, replicas=2)
    entry, real = nodes["n0"], nodes["n1"]
    headers = {"ETag": ETAG, **DIGESTS[digest](GOOD)}
    cutting = await aiohttp_server(dying_owner(GOOD if prefix == "right" else WRONG, headers, die_after=100_000,
                                               label="miss"), host="127.0.0.1")
    ring = Membership(3, {"cutting": f"127.0.0.1:{cutting.port}", "n1": members.nodes["n1"]})
    entry.node.cluster.update(ring)  # the entry node is not in this ring: it must relay
    path = path_owned_by(entry, "cutting")
    origin.put(path, GOOD, etag=ETAG, headers=DIGESTS[digest](GOOD))
    real.node.cluster.update(Membership(2, {"n1": members.nodes["n1"]}))  # alone, n1 fills from the origin
    assert (await real.get(session, path))[2] == GOOD
    await real.node.settled()
    real.node.cluster.update(ring)
    with capture_logs() as logs:
        status, got, body, error = await read_counting(entry, session, path)
    assert any(e["event"] == "peer_resumed" and e["offset"] == 100_000 for e in logs)
    if prefix == "right":
        assert (status, got, error) == (200, len(GOOD), None) and body == GOOD
        assert relay_mismatches(logs) == []
        assert entry.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 0
    else:
        assert status == 200 and error is not None and got < len(GOOD), (status, got, error)
        [event] = relay_mismatches(logs)
        assert event["peer"] == "cutting" and event["bytes"] == len(GOOD)
        assert entry.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1
    assert origin.requests[path] == 1


@pytest.mark.parametrize("prefix", ["right", "wrong"])
async def test_a_relayed_body_resumed_from_the_origin_is_checked_whole(cluster, session, aiohttp_server, prefix):
    """The sole owner drops mid-body; the rest comes from the origin under
    If-Range, and the check runs over both parts."""
    from nezha.config import Origin

    headers = {"ETag": ETAG, **sha256_header(GOOD)}
    upstream = RangedOrigin(GOOD, headers)
    upstream_server = await aiohttp_server(upstream.app(), host="127.0.0.1")
    dead = await aiohttp_server(dying_owner(GOOD if prefix == "right" else WRONG, headers, die_after=100_000,
                                            label="miss"), host="127.0.0.1")
    nodes, members = await cluster(1, origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{upstream_server.port}")])
    entry = nodes["n0"]
    entry.node.cluster.update(Membership(2, {**members.nodes, "dead": f"127.0.0.1:{dead.port}"}))
    path = path_owned_by(entry, "dead")
    with capture_logs() as logs:
        status, got, body, error = await read_counting(entry, session, path)
    assert [(h.get("Range"), h.get("If-Range")) for h in upstream.seen] == [(f"bytes=100000-{len(GOOD) - 1}", ETAG)]
    if prefix == "right":
        assert (status, got, error) == (200, len(GOOD), None) and body == GOOD
        assert relay_mismatches(logs) == []
    else:
        assert status == 200 and error is not None and got < len(GOOD), (status, got, error)
        assert len(relay_mismatches(logs)) == 1
        assert entry.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1


async def test_a_relayed_read_without_a_digest_is_not_checked_and_a_range_is_not_checked_as_the_whole(
        origin, cluster, session):
    """No digest in the head: nothing to check (the bytes are spliced as
    before). A 206's digest fields are of the whole object, not the part."""
    nodes, _ = await cluster(2, replicas=1)
    plain, ranged = "/d/plain.bin", "/d/ranged.bin"
    origin.put(plain, GOOD, etag=ETAG)
    origin.put(ranged, GOOD, etag=ETAG, headers=sha256_header(GOOD))
    _, others = owner_and_other(nodes, plain)
    entry = nodes[others[0]]
    with capture_logs() as logs:
        status, got, body, error = await read_counting(entry, session, plain)
        assert (status, got, error) == (200, len(GOOD), None) and body == GOOD
        _, others = owner_and_other(nodes, ranged)
        async with session.get(nodes[others[0]].url + ranged, headers={"Host": HOST, "Range": "bytes=10-99"}) as r:
            assert r.status == 206 and await r.read() == GOOD[10:100]
    assert relay_mismatches(logs) == []


@pytest.fixture
def spliced(monkeypatch) -> list[int]:
    """Counts the bodies the relay moves by the kernel's splice, unhashed."""
    from cachenode.kernel import splice

    moved: list[int] = []
    real = splice.splice_body

    async def counting(*args, **kwargs):
        moved.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(splice, "splice_body", counting)
    return moved


@pytest.mark.parametrize("digest", list(DIGESTS))
async def test_a_relayed_hit_with_a_digest_is_spliced_unhashed_and_a_fill_in_progress_is_hashed(
        origin, cluster, session, spliced, digest):
    """An owner's hit was checked against the digest when it was filled, and
    nothing cuts a hit for a wrong byte: the relay splices it as it splices
    one with no digest. An owner's fill in progress may yet be cut for one:
    the relay hashes it."""
    nodes, _ = await cluster(2, replicas=1)
    cold, warm = "/d/cold.bin", "/d/warm.bin"
    for path in (cold, warm):
        origin.put(path, GOOD, etag=ETAG, headers=DIGESTS[digest](GOOD))
    owners, others = owner_and_other(nodes, warm)
    assert (await nodes[owners[0]].get(session, warm))[2] == GOOD
    await nodes[owners[0]].node.settled()
    status, got, body, error = await read_counting(nodes[others[0]], session, warm)
    assert (status, got, error) == (200, len(GOOD), None) and body == GOOD
    assert spliced == [1], "the hit was hashed on its way through the relay"
    _, others = owner_and_other(nodes, cold)
    status, got, body, error = await read_counting(nodes[others[0]], session, cold)
    assert (status, got, error) == (200, len(GOOD), None) and body == GOOD
    assert spliced == [1], "the owner's fill in progress went through the relay unhashed"


@pytest.mark.parametrize("rest", ["right", "wrong"])
async def test_a_spliced_hit_resumed_from_the_origin_is_checked_whole_with_its_head_read_again(
        cluster, session, aiohttp_server, spliced, rest):
    """The sole owner's hit breaks mid-body and the rest comes from the
    origin, which no node checks: the relay asks the origin for the head it
    sent again, under the same If-Range, and checks the whole. A wrong rest
    never ends cleanly."""
    from nezha.config import Origin

    served = GOOD if rest == "right" else GOOD[:600_000] + bytes([GOOD[600_000] ^ 0x01]) + GOOD[600_001:]
    headers = {"ETag": ETAG, **sha256_header(GOOD)}
    upstream = RangedOrigin(served, headers)
    upstream_server = await aiohttp_server(upstream.app(), host="127.0.0.1")
    dead = await aiohttp_server(dying_owner(GOOD, headers, die_after=100_000, label="hit"), host="127.0.0.1")
    nodes, members = await cluster(1, origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{upstream_server.port}")])
    entry = nodes["n0"]
    entry.node.cluster.update(Membership(2, {**members.nodes, "dead": f"127.0.0.1:{dead.port}"}))
    path = path_owned_by(entry, "dead")
    with capture_logs() as logs:
        status, got, body, error = await read_counting(entry, session, path)
    assert spliced == [1]
    assert sorted((h.get("Range"), h.get("If-Range")) for h in upstream.seen) == [
        ("bytes=0-99999", ETAG), (f"bytes=100000-{len(GOOD) - 1}", ETAG)]
    if rest == "right":
        assert (status, got, error) == (200, len(GOOD), None) and body == GOOD
        assert relay_mismatches(logs) == []
    else:
        assert status == 200 and error is not None and got < len(GOOD), (status, got, error)
        [event] = relay_mismatches(logs)
        assert event["peer"] == "dead" and event["bytes"] == len(GOOD)
        assert entry.node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1


@pytest.mark.parametrize("served", ["right", "wrong"])
async def test_an_owners_fill_hands_the_relay_the_digest_it_checks_which_the_client_never_sees(
        origin, cluster, session, spliced, served):
    """A Hugging Face LFS file's sha256 (X-Linked-ETag) came on the redirect
    the owner followed, not on the bytes' head, which names no digest: the
    owner's fill hands it to the relay (X-Nezha-Digest), which hashes the
    body and checks it across the resume after the owner's cut."""
    from nezha.keys import Target

    nodes, _ = await cluster(2, replicas=1)
    path = "/xet-bridge/blobs/abc"
    origin.put(path, GOOD if served == "right" else WRONG, etag=ETAG)
    owners, others = owner_and_other(nodes, path)
    owner, entry = nodes[owners[0]], nodes[others[0]]
    # As when the owner fetched the redirect that named the file's sha256.
    owner.node.engine.runs.digests.noted(
        Target("http", HOST, "/repo/resolve/main/model.safetensors", ""), 302,
        {"X-Linked-ETag": f'"{hashlib.sha256(GOOD).hexdigest()}"', "Location": f"http://{HOST}{path}"})
    with capture_logs() as logs:
        async with session.get(entry.url + path, headers={"Host": HOST}) as r:
            assert r.status == 200 and "X-Nezha-Digest" not in r.headers
            got = bytearray()
            try:
                async for chunk in r.content.iter_any():
                    got += chunk
                error = None
            except aiohttp.ClientPayloadError as e:
                error = e
        for node in nodes.values():
            await node.node.settled()
    assert spliced == [], "the relay did not hash the owner's fill"
    if served == "right":
        assert error is None and bytes(got) == GOOD
        [done] = [e for e in logs if e["event"] == "fill_completed"]
        assert done["verified"] == "X-Linked-ETag"
    else:
        # The owner cut its fill; the rest came from the origin by Range, and
        # only the relay's check of the whole keeps the end from the client.
        assert error is not None and len(got) < len(GOOD)
        assert any(e["event"] == "origin_resumed" for e in logs)
        [event] = relay_mismatches(logs)
        assert event["field"] == "X-Linked-ETag via X-Nezha-Digest"


@pytest.mark.parametrize("entry_is", ["the-redirects-owner", "its-relay"])
async def test_a_hugging_face_digest_reaches_the_targets_owner_from_the_node_the_redirect_passed_through(
        origin, cluster, session, entry_is):
    """The redirect's key and its target's have different owners. The node
    the client reads both through saw the redirect (as its owner, or as the
    relay that passed it on) and noted the sha256 it names: as the relay of
    the target it hands the sha256 to the target's owner, whose fill checks
    it; as the target's owner it checks it itself. Wrong bytes are cut, not
    stored, and counted where the fill ran."""
    nodes, _ = await cluster(2, replicas=1)
    redirect = "/org/model/resolve/main/model.safetensors"
    [r_owner], _ = owner_and_other(nodes, redirect)
    target = next(p for p in (f"/xet-bridge/blobs/{i}" for i in range(100))
                  if owner_and_other(nodes, p)[0] != [r_owner])
    [t_owner], _ = owner_and_other(nodes, target)
    entry = nodes[r_owner] if entry_is == "the-redirects-owner" else nodes[t_owner]
    origin.put(redirect, b"", status=302, headers={
        "Location": f"http://{HOST}{target}", "X-Linked-ETag": f'"{hashlib.sha256(GOOD).hexdigest()}"',
        "Cache-Control": "no-store"})
    origin.put(target, WRONG, etag=ETAG)
    async with session.get(entry.url + redirect, headers={"Host": HOST}, allow_redirects=False) as r:
        assert r.status == 302
    with capture_logs() as logs:
        status, got, _, error = await read_counting(entry, session, target)
        for node in nodes.values():
            await node.node.settled()
    assert status == 200 and error is not None and got < len(GOOD), (status, got, error)
    assert all(key_of(target) not in node.node.store for node in nodes.values())
    fill_mismatches = [e for e in logs if e["event"] == "digest_mismatch" and e.get("source") != "relay"]
    assert [e["field"] for e in fill_mismatches] == [
        "X-Linked-ETag via X-Nezha-Digest" if entry_is == "the-redirects-owner" else "X-Linked-ETag"]
    assert nodes[t_owner].node.metrics.digest_mismatches.labels(origin=HOST)._value.get() == 1
