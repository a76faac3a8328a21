"""A hot copy that may not answer as fresh is revalidated against the key's owner, never the origin
(issue 27, part 1): a conditional request with the copy's validators, relayed like any read; the owner's
304 renews the copy with the owner's expiry and this node serves it from its own disk; any other answer
is relayed and the copy goes. Hot copies of a response that varies hold the variant their reads select.

In-process nodes on 127.0.0.1 sharing one ring (the `cluster` fixture); the origin double logs every
request's fields, whose Via names the node that asked.
"""

from __future__ import annotations

import hashlib
import time

import pytest
from structlog.testing import capture_logs

from nezha.config import Origin
from tests.integration.cachenode.conftest import HOST, owner_and_other, until
from tests.integration.cachenode.test_hot_copies import KEY, PATH, read_until_hot, stored_hot
from tests.integration.cachenode.test_vary import GZIPPED, PLAIN, PATH as VARY_PATH, NegotiatingOrigin, encoding

V1 = b"v1" * 50_000
V2 = b"v2" * 50_000


async def hot_copy_on(nodes, reader: str, session, path: str = PATH, key: str = KEY) -> None:
    await read_until_hot(nodes[reader], session, path, 2)
    await until(lambda: stored_hot(nodes[reader], key))


@pytest.fixture
async def negotiating(aiohttp_server):
    """An origin that gzips for clients that accept it (`Vary: Accept-Encoding`), as in test_vary.py."""
    async def start() -> NegotiatingOrigin:
        o = NegotiatingOrigin()
        server = await aiohttp_server(o.app(), host="127.0.0.1")
        o.url = f"http://127.0.0.1:{server.port}"
        return o

    return start


def short(body: bytes) -> str:
    """A body as its length and digest: an assertion that fails names them, not a megabyte of bytes."""
    return f"{len(body)} bytes, sha256 {hashlib.sha256(body).hexdigest()[:12]}"


def asked_by(origin) -> list[str | None]:
    """The node behind each origin request (its Via entry), in order."""
    return [h.get("Via") for h in origin.request_headers]


async def test_a_stale_hot_copy_is_revalidated_with_the_owner_and_served_from_this_nodes_disk(origin, cluster,
                                                                                            session):
    origin.put(PATH, V1, headers={"Cache-Control": "max-age=3"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await hot_copy_on(nodes, reader, session)
    copy = nodes[reader].node.store.lookup(KEY)
    await until(lambda: time.time() > copy.expires_at, timeout=10)
    with capture_logs() as logs:
        status, headers, body = await nodes[reader].get(session, PATH)
    assert status == 200 and short(body) == short(V1)
    assert headers["X-Nezha-Cache"] == "hot-hit" and headers["X-Nezha-Served-By"] == reader
    # The reader asked the owner with the copy's ETag; the owner, its own copy stale too, asked the origin.
    owner_side = [e for e in logs if e["event"] == "request_completed" and e.get("status") == 304]
    assert [e["cache"] for e in owner_side] == ["revalidated"], "the owner answered the conditional with 304"
    assert [e["owner"] for e in logs if e["event"] == "hot_copy_revalidated"] == [owner]
    assert not [e for e in logs if e["event"] == "hot_copy_dropped"]
    assert origin.requests[PATH] == 2 and asked_by(origin) == [f"1.1 {owner}"] * 2, "never the non-owner"
    assert origin.request_headers[-1]["If-None-Match"] == origin.etags[PATH]
    # Renewed with the owner's new freshness, no later.
    renewed, owned = nodes[reader].node.store.lookup(KEY), nodes[owner].node.store.lookup(KEY)
    assert renewed.hot and renewed.expires_at > copy.expires_at
    assert abs(renewed.expires_at - owned.expires_at) < 0.01
    status, headers, body = await nodes[reader].get(session, PATH)
    if time.time() < renewed.expires_at:  # read within the renewed freshness (a loaded machine may miss it)
        assert headers["X-Nezha-Cache"] == "hot-hit" and short(body) == short(V1)


async def test_after_the_owner_revalidates_a_replaced_object_no_read_through_the_non_owner_gets_old_bytes(
        origin, cluster, session):
    origin.put(PATH, V1, headers={"Cache-Control": "max-age=3"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await hot_copy_on(nodes, reader, session)
    copy = nodes[reader].node.store.lookup(KEY)
    origin.put(PATH, V2, headers={"Cache-Control": "max-age=3600"})  # replaced, nobody told
    await until(lambda: time.time() > copy.expires_at, timeout=10)
    labels = []
    for _ in range(6):  # until the new bytes are hot here again
        status, headers, body = await nodes[reader].get(session, PATH)
        assert status == 200 and short(body) == short(V2), f"old bytes after {labels}"
        labels.append(headers["X-Nezha-Cache"])
        await nodes[reader].node.settled()
    assert labels[0].startswith("peer-") and labels[-1] == "hot-hit", labels
    assert nodes[reader].node.store.lookup(KEY).etag == origin.etags[PATH]
    assert set(asked_by(origin)) == {f"1.1 {owner}"}


async def test_a_clients_if_none_match_is_answered_from_the_hot_copy_fresh_or_revalidated(origin, cluster,
                                                                                         session):
    origin.put(PATH, V1, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await hot_copy_on(nodes, reader, session)
    etag = origin.etags[PATH]
    for extra in ({}, {"Cache-Control": "no-cache"}):  # the fresh copy itself; then revalidated by the owner
        status, headers, body = await nodes[reader].get(session, PATH, headers={"If-None-Match": etag, **extra})
        assert status == 304 and body == b"" and headers["ETag"] == etag, extra
        assert headers["X-Nezha-Cache"] == "hot-hit" and headers["X-Nezha-Served-By"] == reader
    # A tag that does not match gets the copy's bytes, from here.
    status, headers, body = await nodes[reader].get(session, PATH, headers={"If-None-Match": '"other"',
                                                                            "Cache-Control": "no-cache"})
    assert status == 200 and short(body) == short(V1) and headers["X-Nezha-Cache"] == "hot-hit"
    assert origin.requests[PATH] == 3 and set(asked_by(origin)) == {f"1.1 {owner}"}


async def test_a_clients_if_none_match_naming_the_owners_new_version_gets_304_and_the_old_copy_goes(
        origin, cluster, session):
    origin.put(PATH, V1, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await hot_copy_on(nodes, reader, session)
    origin.put(PATH, V2, headers={"Cache-Control": "max-age=3600"})
    new_tag = origin.etags[PATH]
    with capture_logs() as logs:
        status, headers, body = await nodes[reader].get(session, PATH, headers={"If-None-Match": new_tag,
                                                                                "Cache-Control": "no-cache"})
    assert status == 304 and headers["ETag"] == new_tag and headers["X-Nezha-Served-By"] == owner
    assert [e["reason"] for e in logs if e["event"] == "hot_copy_dropped"] == ["replaced at the owner"]
    assert KEY not in nodes[reader].node.store
    await nodes[owner].node.settled()  # the owner's fill of the new bytes, stored
    status, headers, body = await nodes[reader].get(session, PATH)
    assert short(body) == short(V2) and headers["X-Nezha-Cache"].startswith("peer-")


async def test_a_varying_object_read_hot_is_copied_in_the_variant_read_and_another_variants_reader_never_gets_it(
        negotiating, cluster, session):
    origin = await negotiating()
    nodes, _ = await cluster(2, hot_reads=3, origins=[Origin(host=HOST, upstream=origin.url)])
    (owner,), (reader,) = owner_and_other(nodes, VARY_PATH)
    key = f"http://{HOST}{VARY_PATH}"
    store = nodes[reader].node.store
    # Four reads of the key, two per variant: counted per key they would make it hot (and copy identity,
    # read twice); counted per variant, nothing is hot yet.
    labels = []
    for accept in ("gzip", "gzip", "identity", "identity"):
        _, headers, body = await nodes[reader].get(session, VARY_PATH, headers=encoding(accept))
        assert short(body) == short(GZIPPED if accept == "gzip" else PLAIN)
        labels.append(headers["X-Nezha-Cache"])
        await nodes[reader].node.settled()
    assert labels == ["peer-miss", "peer-hit", "peer-miss", "peer-hit"]
    assert len(store) == 0
    # The third gzip read makes that variant hot: its copy is the gzip variant, asked of the owner.
    _, headers, body = await nodes[reader].get(session, VARY_PATH, headers=encoding("gzip"))
    assert short(body) == short(GZIPPED) and headers["X-Nezha-Cache"] == "peer-hit"
    await until(lambda: (m := store.lookup(key, encoding("gzip"))) is not None and m.hot)
    await nodes[reader].node.settled()
    assert store.lookup(key, encoding("identity")) is None and len(store) == 1
    _, headers, body = await nodes[reader].get(session, VARY_PATH, headers=encoding("gzip"))
    assert short(body) == short(GZIPPED) and headers["X-Nezha-Cache"] == "hot-hit" and headers["Vary"] == "Accept-Encoding"
    # Other variants, one with the same bytes ("gzip, deflate" is gzipped too): never the gzip copy.
    others = ("identity", "br", "deflate", "gzip, deflate")
    for accept in others:
        _, headers, body = await nodes[reader].get(session, VARY_PATH, headers=encoding(accept))
        assert short(body) == short(GZIPPED if "gzip" in accept else PLAIN), accept
        assert headers["X-Nezha-Cache"].startswith("peer-"), accept
    assert origin.requests == ["gzip", "identity", *others[1:]], "the copy came from the owner"


async def test_a_range_and_a_head_that_need_revalidation_are_answered_from_the_renewed_copy(origin, cluster,
                                                                                          session):
    origin.put(PATH, V1, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await hot_copy_on(nodes, reader, session)
    again = {"Cache-Control": "no-cache"}
    status, headers, body = await nodes[reader].get(session, PATH, headers={"Range": "bytes=10-19", **again})
    assert status == 206 and body == V1[10:20] and headers["Content-Range"] == f"bytes 10-19/{len(V1)}"
    assert headers["X-Nezha-Cache"] == "hot-hit" and headers["X-Nezha-Served-By"] == reader
    status, headers, body = await nodes[reader].get(session, PATH, method="HEAD", headers=again)
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(V1))
    assert headers["X-Nezha-Cache"] == "hot-hit" and headers["X-Nezha-Served-By"] == reader
    assert origin.requests[PATH] == 3 and set(asked_by(origin)) == {f"1.1 {owner}"}
