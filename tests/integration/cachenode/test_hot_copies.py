"""Hot copies (issue 27, part 1): a non-owner that relays `--hot-reads` reads of one object within
`--hot-window` copies it from the owner and serves it from its own disk, exactly: never older than the
owner's freshness, never past a write, within its share of capacity, never from the origin.

In-process nodes on 127.0.0.1, each on its own port, sharing one ring (the `cluster` fixture); the
process-level check with a real redis-server is tests/integration/cluster/test_hot_copies_processes.py.
"""

from __future__ import annotations

import time

from structlog.testing import capture_logs

from tests.integration.cachenode.conftest import HOST, key_of, owner_and_other, until

PATH = "/datasets/hot/cifar-100-python.tar.gz"
KEY = f"http://{HOST}{PATH}"
BODY = bytes(range(256)) * 4096  # 1 MiB, every byte value


async def read_until_hot(node, session, path: str, reads: int) -> list[str]:
    """`reads` GETs of `path` through `node`, each exact; their X-Nezha-Cache values."""
    labels = []
    for _ in range(reads):
        status, headers, body = await node.get(session, path)
        assert status == 200
        labels.append(headers["X-Nezha-Cache"])
    return labels


def stored_hot(node, key: str) -> bool:
    meta = node.node.store.lookup(key)
    return meta is not None and meta.hot


async def test_after_hot_reads_a_non_owner_serves_hot_hit_from_its_own_disk(origin, cluster, session):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, hot_reads=3, hot_window=60)
    (owner,), (reader, bystander) = owner_and_other(nodes, PATH)
    assert await read_until_hot(nodes[reader], session, PATH, 3) == ["peer-miss", "peer-hit", "peer-hit"]
    await until(lambda: stored_hot(nodes[reader], KEY))
    for method in ("GET", "GET", "HEAD"):  # the fast path, twice, and the handler's HEAD
        status, headers, body = await nodes[reader].get(session, PATH, method=method)
        assert status == 200 and headers["X-Nezha-Cache"] == "hot-hit"
        assert headers["X-Nezha-Served-By"] == reader
        assert body == (BODY if method == "GET" else b"")
    # A Range, which the fast path leaves to the handler, is served from the hot copy too.
    status, headers, body = await nodes[reader].get(session, PATH, headers={"Range": "bytes=1000-1999"})
    assert status == 206 and body == BODY[1000:2000] and headers["X-Nezha-Cache"] == "hot-hit"
    assert origin.requests[PATH] == 1, "the copy came from the owner, not the origin"
    copy, owned = nodes[reader].node.store.lookup(KEY), nodes[owner].node.store.lookup(KEY)
    assert not owned.hot and abs(copy.expires_at - owned.expires_at) < 0.01, "the copy keeps the owner's expiry"
    assert KEY not in nodes[bystander].node.store, "only the node the reads went through copies"
    async with session.get(nodes[reader].url + "/metrics") as r:
        assert 'nezha_requests_total{cache="hot-hit"} 4.0' in await r.text()


async def test_hot_reads_zero_turns_hot_copies_off(origin, cluster, session):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, hot_reads=0)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    labels = await read_until_hot(nodes[reader], session, PATH, 12)
    assert labels == ["peer-miss"] + ["peer-hit"] * 11
    await nodes[reader].node.settled()
    assert len(nodes[reader].node.store) == 0 and origin.requests[PATH] == 1


async def test_reads_slower_than_the_window_make_no_copy(origin, cluster, session):
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, hot_reads=2, hot_window=0.05)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    for _ in range(3):
        await read_until_hot(nodes[reader], session, PATH, 1)
        later = time.monotonic() + 0.2
        await until(lambda: time.monotonic() > later)
    await nodes[reader].node.settled()
    assert KEY not in nodes[reader].node.store


async def test_a_write_through_any_node_removes_the_hot_copies_before_it_is_answered(origin, cluster, session):
    origin.put(PATH, b"old!" * 50_000, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, hot_reads=2)
    (owner,), (reader, writer) = owner_and_other(nodes, PATH)
    await read_until_hot(nodes[reader], session, PATH, 2)
    await until(lambda: stored_hot(nodes[reader], KEY))
    assert (await nodes[reader].get(session, PATH))[1]["X-Nezha-Cache"] == "hot-hit"
    # The write enters through the third node, which neither owns the key nor holds a copy.
    async with session.put(nodes[writer].url + PATH, data=b"new!" * 10, headers={"Host": HOST}) as r:
        assert r.status in (200, 201, 204)
    assert KEY not in nodes[reader].node.store and KEY not in nodes[owner].node.store
    origin.put(PATH, b"new!" * 10, headers={"Cache-Control": "max-age=3600"})
    status, headers, body = await nodes[reader].get(session, PATH)
    assert body == b"new!" * 10 and headers["X-Nezha-Cache"] == "peer-miss"


async def test_a_stale_hot_copy_replaced_at_the_origin_is_dropped_when_the_owner_revalidates(origin, cluster,
                                                                                              session):
    """The copy expires when the owner's copy does (3 s: room for a loaded machine to copy first); the next
    read asks the owner with the copy's validators, the owner (never the node that held the copy) asks the
    origin, which has new bytes by then: they are relayed, and the copy goes before they are."""
    origin.put(PATH, b"v1" * 50_000, headers={"Cache-Control": "max-age=3"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await read_until_hot(nodes[reader], session, PATH, 2)
    await until(lambda: stored_hot(nodes[reader], KEY))
    copy = nodes[reader].node.store.lookup(KEY)
    assert abs(copy.expires_at - nodes[owner].node.store.lookup(KEY).expires_at) < 0.01
    status, headers, body = await nodes[reader].get(session, PATH)
    if headers["X-Nezha-Cache"] == "hot-hit":  # read before the copy expired, on a loaded machine or not
        assert body == b"v1" * 50_000
    origin.put(PATH, b"v2" * 50_000, headers={"Cache-Control": "max-age=3"})  # replaced, nobody told
    await until(lambda: time.time() > copy.expires_at, timeout=10)
    with capture_logs() as logs:
        status, headers, body = await nodes[reader].get(session, PATH)
    assert body == b"v2" * 50_000 and headers["X-Nezha-Cache"].startswith("peer-")
    assert [e["reason"] for e in logs if e["event"] == "hot_copy_dropped"] == ["replaced at the owner"]
    assert origin.requests[PATH] == 2, "one fill and one revalidation, both by the owner"
    assert all(h.get("Via") == f"1.1 {owner}" for h in origin.request_headers)
    async with session.get(nodes[reader].url + "/metrics") as r:
        assert "nezha_bytes_from_origin_total 0.0" in await r.text()


async def test_hot_copies_stay_within_the_hot_share_least_recently_used_evicted(origin, cluster, session):
    nodes, _ = await cluster(2, hot_reads=2, capacity=100_000, hot_share=0.3)  # 30,000 bytes of hot copies
    reader = next(iter(nodes))
    paths = []
    for i in range(40):  # objects the other node owns
        path = f"/datasets/hot/{i}.bin"
        if owner_and_other(nodes, path)[0] != [reader]:
            paths.append(path)
        if len(paths) == 4:
            break
    big = paths.pop()
    for path in paths + [big]:
        origin.put(path, path.encode().ljust(100, b".") * (120 if path != big else 400),
                   headers={"Cache-Control": "max-age=3600"})
    store = nodes[reader].node.store
    for path in paths:
        await read_until_hot(nodes[reader], session, path, 2)
        await until(lambda: stored_hot(nodes[reader], key_of(path)))
        assert store.hot_bytes <= 30_000
    assert [key_of(p) in store for p in paths] == [False, True, True], "the least recently read copy went"
    await read_until_hot(nodes[reader], session, big, 4)  # 40,000 bytes never fit the share
    await nodes[reader].node.settled()
    assert key_of(big) not in store
    assert (await nodes[reader].get(session, big))[1]["X-Nezha-Cache"] == "peer-hit"


async def test_an_authorize_origins_object_is_never_hot_copied_each_read_asks_the_origin(aiohttp_server, cluster,
                                                                                         session):
    """In this slice a private object stays on its owners: each read through a non-owner is relayed, and
    the owner has the origin authorise it (docs/private-objects.md)."""
    from nezha.config import Origin
    from tests.support_bearer import BODY as PRIVATE, GOOD, PATH as PRIVATE_PATH, serve_bearer

    bearer = await serve_bearer(aiohttp_server)
    upstream = str(bearer.server.make_url("")).rstrip("/")
    nodes, _ = await cluster(2, hot_reads=2,
                             origins=[Origin(host=HOST, upstream=upstream, credentials="authorize")])
    (owner,), (reader,) = owner_and_other(nodes, PRIVATE_PATH)
    labels = []
    for _ in range(6):
        status, headers, body = await nodes[reader].get(session, PRIVATE_PATH,
                                                        headers={"Authorization": f"Bearer {GOOD}"})
        assert status == 200 and body == PRIVATE
        labels.append(headers["X-Nezha-Cache"])
        await nodes[reader].node.settled()
    assert labels == ["peer-miss"] + ["peer-authorized"] * 5
    assert len(nodes[reader].node.store) == 0
    assert bearer.authorizations == [f"Bearer {GOOD}"] * 6


async def test_a_draining_node_hands_off_what_it_owns_never_its_hot_copies(origin, cluster, session):
    from cachenode.cluster_view import ClusterView
    from nezha.ring import Membership

    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    nodes, members = await cluster(3, hot_reads=2)
    (owner,), (reader, _) = owner_and_other(nodes, PATH)
    await read_until_hot(nodes[reader], session, PATH, 2)
    await until(lambda: stored_hot(nodes[reader], KEY))
    view = ClusterView(node_id=reader, replicas=1)
    view.update(Membership(2, {nid: a for nid, a in members.nodes.items() if nid != reader}))
    progress = await nodes[reader].node.handoff.run(view)
    assert (progress.total, progress.copied, progress.present, progress.failed) == (0, 0, 0, 0)
    assert origin.requests[PATH] == 1


async def test_a_request_that_asks_for_validation_is_revalidated_by_the_owner_and_served_from_the_hot_copy(
        origin, cluster, session):
    """`no-cache` wants the origin's word: the node asks the owner with the copy's validators and the
    client's `no-cache`, the owner asks the origin, and its 304 lets this node serve its own copy."""
    origin.put(PATH, BODY, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await read_until_hot(nodes[reader], session, PATH, 2)
    await until(lambda: stored_hot(nodes[reader], KEY))
    status, headers, body = await nodes[reader].get(session, PATH, headers={"Cache-Control": "no-cache"})
    assert body == BODY and headers["X-Nezha-Cache"] == "hot-hit" and headers["X-Nezha-Served-By"] == reader
    assert origin.requests[PATH] == 2, "the owner revalidated, once"
    assert origin.request_headers[-1].get("If-None-Match") == origin.etags[PATH]
    assert origin.request_headers[-1].get("Via") == f"1.1 {owner}"
    assert stored_hot(nodes[reader], KEY)
    status, headers, body = await nodes[reader].get(session, PATH)
    assert body == BODY and headers["X-Nezha-Cache"] == "hot-hit"


async def test_with_every_owner_down_a_hot_copy_is_not_revalidated_at_the_origin(origin, cluster, session):
    """A request the fresh copy may not answer (`no-cache`) finds every owner down: the node goes to the
    origin, as any node does then, but with nothing of the hot copy: it is dropped, and the node's fill
    is its own (not hot)."""
    origin.put(PATH, b"v1" * 50_000, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2, hot_reads=2)
    (owner,), (reader,) = owner_and_other(nodes, PATH)
    await read_until_hot(nodes[reader], session, PATH, 2)
    await until(lambda: stored_hot(nodes[reader], KEY))
    await nodes[owner].server.close()
    origin.put(PATH, b"v2" * 50_000, headers={"Cache-Control": "max-age=3600"})
    with capture_logs() as logs:
        status, headers, body = await nodes[reader].get(session, PATH, headers={"Cache-Control": "no-cache"})
    assert body == b"v2" * 50_000 and headers["X-Nezha-Cache"] == "miss"
    assert [e["reason"] for e in logs if e["event"] == "hot_copy_dropped"] == ["owners unreachable"]
    await nodes[reader].node.settled()
    assert not nodes[reader].node.store.lookup(KEY).hot
