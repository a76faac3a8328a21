"""The cache is invisible to a job: every end-to-end field, both ways, on every path.

hostAliases send all of a pod's traffic for a dataset host here, so clients
that read `X-Repo-Commit`, `x-goog-hash` or `x-amz-meta-*`, or origins that
key on `User-Agent`, must see exactly what they would without the cache.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.cachenode.conftest import HOST

PATH = "/datasets/shard-000.tar"
KEY = f"http://{HOST}{PATH}"

# One row per class of header some client depends on; each is a list of
# fields, repeated names included, in the order the origin sends them. The
# digests are the real ones of the body the tests serve (b"d" * 4000): a
# fill checks them (cachenode/fill/verify.py).
HEADER_CLASSES = {
    "huggingface_hub": [("X-Repo-Commit", "4f5c0e1d2a3b"), ("X-Linked-Etag", '"sha256-abc"'),
                        ("X-Linked-Size", "1048576")],
    "gcs": [("x-goog-hash", "crc32c=zSD3sA=="), ("x-goog-hash", "md5=aoOae5qgtwkzJ4I+vc7oCA=="),
            ("x-goog-generation", "1700000000000000"), ("x-goog-stored-content-length", "4000")],
    "s3": [("x-amz-version-id", "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"), ("x-amz-meta-split", "train"),
           ("x-amz-meta-owner", "vision"), ("x-amz-checksum-sha256", "JdMpXtw9DRVzNBht4wHYL1Y/eaBag7jyl7+4Rh88IEk=")],
    "integrity": [("Content-MD5", "aoOae5qgtwkzJ4I+vc7oCA=="), ("Digest", "sha-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=")],
    "links": [("Link", '<https://mirror.example/a>; rel="duplicate"'), ("Link", '<https://mirror.example/b>; rel="duplicate"'),
              ("Content-Disposition", 'attachment; filename="shard-000.tar"')],
}


def fields_of(headers, names) -> list[tuple[str, str]]:
    wanted = {n.lower() for n in names}
    return [(k.lower(), v) for k, v in headers.items() if k.lower() in wanted]


def expect(pairs) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in pairs]


@pytest.mark.parametrize("fast_hits", [True, False], ids=["fast-path", "aiohttp"])
@pytest.mark.parametrize("kind", sorted(HEADER_CLASSES))
async def test_origin_fields_round_trip_on_miss_hit_and_304_refresh(origin, make_node, session, kind, fast_hits):
    pairs = HEADER_CLASSES[kind]
    names = {n for n, _ in pairs}
    origin.put(PATH, b"d" * 4000, headers={"Cache-Control": "max-age=3600"}, fields=pairs)
    node = await make_node(fast_hits=fast_hits)
    for label in ("miss", "hit"):
        status, headers, body = await node.get(session, PATH)
        assert status == 200 and body == b"d" * 4000 and headers["X-Nezha-Cache"] == label
        assert fields_of(headers, names) == expect(pairs), label
        await node.node.settled()
    head = await node.get(session, PATH, method="HEAD")
    assert head[1]["X-Nezha-Cache"] == "hit" and fields_of(head[1], names) == expect(pairs)


async def test_a_304_updates_the_stored_fields_it_carries_and_keeps_the_rest(origin, make_node, session):
    """RFC 9111 §3.2: a revalidation's fields replace the stored ones of the same name."""
    origin.put(PATH, b"d" * 4000, headers={"Cache-Control": "max-age=0", "X-Repo-Commit": "old"},
               fields=HEADER_CLASSES["gcs"])
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    # The origin's 304 carries a new commit and a new lifetime; the goog fields are not in it.
    origin.put(PATH, b"d" * 4000, headers={"Cache-Control": "max-age=600", "X-Repo-Commit": "new"})
    status, headers, _ = await node.get(session, PATH)
    assert headers["X-Nezha-Cache"] == "revalidated"
    assert headers["X-Repo-Commit"] == "new" and headers["Cache-Control"] == "max-age=600"
    assert fields_of(headers, {"x-goog-hash"}) == expect(HEADER_CLASSES["gcs"][:2])
    await node.node.settled()
    status, headers, _ = await node.get(session, PATH)
    assert headers["X-Nezha-Cache"] == "hit" and headers["X-Repo-Commit"] == "new"
    assert origin.requests[PATH] == 2


async def test_a_huggingface_resolve_head_returns_the_commit_and_linked_fields(origin, make_node, session):
    """huggingface_hub's HEAD of /<repo>/resolve/<rev>/<file> refuses to download without these."""
    path = "/bert-base-uncased/resolve/main/model.safetensors"
    pairs = HEADER_CLASSES["huggingface_hub"]
    origin.put(path, b"w" * 5000, headers={"Cache-Control": "max-age=3600"}, fields=pairs)
    node = await make_node()
    for label in ("pass", "miss", "hit"):  # a HEAD not on disk is passed; then a GET stores it
        method = "GET" if label == "miss" else "HEAD"
        status, headers, _ = await node.get(session, path, method=method)
        await node.node.settled()
        assert status == 200 and headers["X-Nezha-Cache"] == label
        assert fields_of(headers, {n for n, _ in pairs}) == expect(pairs)
        assert headers["Content-Length"] == "5000"


async def test_a_miss_forwards_the_leading_requests_end_to_end_fields(origin, make_node, session):
    origin.put(PATH, b"d" * 10, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    sent = {"User-Agent": "huggingface_hub/0.26; python/3.11", "Accept": "application/octet-stream",
            "Accept-Language": "fr-CH, fr;q=0.9", "X-Request-Id": "job-42"}
    await node.get(session, PATH, headers={**sent, "Range": "bytes=0-3", "If-None-Match": '"other"'})
    got = {k.lower(): v for k, v in origin.raw_headers[-1]}
    for name, value in sent.items():
        assert got.get(name.lower()) == value, name
    # The fill asks for the whole object, with no client validators: it is for everyone.
    assert "range" not in got and "if-none-match" not in got


async def test_via_is_added_on_both_sides(origin, make_node, session):
    """RFC 9110 §7.6.3: the request the origin gets and the response the client gets name the cache."""
    origin.put(PATH, b"d" * 10, headers={"Cache-Control": "max-age=3600"}, fields=[("Via", "1.1 cdn-edge")])
    node = await make_node(node_id="nezha-cache-0")
    _, miss, _ = await node.get(session, PATH, headers={"Via": "1.0 corp-proxy"})
    assert dict(origin.raw_headers[-1])["Via"] == "1.0 corp-proxy, 1.1 nezha-cache-0"
    await node.node.settled()
    _, hit, _ = await node.get(session, PATH)
    for headers in (miss, hit):
        assert headers.getall("Via") == ["1.1 cdn-edge, 1.1 nezha-cache-0"]
    await node.get(session, "/upload", method="PUT", headers={"Content-Length": "0"})
    assert dict(origin.raw_headers[-1])["Via"] == "1.1 nezha-cache-0"


HOP_BY_HOP = ["Keep-Alive", "TE", "Trailer", "Upgrade", "Proxy-Authorization", "Proxy-Connection",
              "X-Listed-In-Connection"]


async def raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    writer.close()
    return head


@pytest.mark.parametrize("method", ["GET", "PUT"])
async def test_no_hop_by_hop_field_crosses_the_cache_either_way(origin, make_node, aiohttp_server, method):
    """RFC 9110 §7.6.1: Connection, the fields it lists, Keep-Alive, TE, Trailer,
    Upgrade and Proxy-* describe one connection, not the message."""
    from aiohttp import web

    seen: list[list[str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append([k.lower() for k in request.headers])
        await request.read()
        resp = web.Response(body=b"x" * 10, headers={"Cache-Control": "max-age=60", "ETag": '"e"'})
        for name in HOP_BY_HOP:
            resp.headers[name] = "1"
        resp.headers["Connection"] = "keep-alive, X-Listed-In-Connection"
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await aiohttp_server(app, host="127.0.0.1")
    from nezha.config import Origin

    node = await make_node(origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{server.port}")])
    fields = "".join(f"{n}: 1\r\n" for n in HOP_BY_HOP if n != "TE") + "TE: trailers\r\n"
    body = b"" if method == "GET" else b"up"
    request = (f"{method} {PATH} HTTP/1.1\r\nHost: {HOST}\r\nConnection: keep-alive, X-Listed-In-Connection\r\n"
               f"{fields}Content-Length: {len(body)}\r\nX-End-To-End: yes\r\n\r\n").encode() + body
    head = (await raw_exchange(node.server.port, request)).lower()
    assert "x-end-to-end" in seen[-1]
    for name in HOP_BY_HOP:
        assert name.lower() not in seen[-1], f"{name} reached the origin"
        assert f"\r\n{name.lower()}:".encode() not in head, f"{name} reached the client"
    if method == "GET":
        await node.node.settled()
        head = (await raw_exchange(node.server.port, f"GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())).lower()
        assert b"x-nezha-cache: hit" in head
        for name in HOP_BY_HOP:
            assert f"\r\n{name.lower()}:".encode() not in head, f"{name} was stored"


async def test_set_cookie_is_never_stored_and_its_response_never_shared(origin, make_node, session):
    origin.put(PATH, b"mine", headers={"Cache-Control": "max-age=3600", "Set-Cookie": "sid=alice"})
    node = await make_node()
    for _ in range(2):
        status, headers, body = await node.get(session, PATH)
        assert headers["X-Nezha-Cache"] == "pass" and headers["Set-Cookie"] == "sid=alice"
    assert origin.requests[PATH] == 2 and len(node.node.store) == 0


async def test_an_origin_whose_fields_exceed_the_stored_bound_is_passed_and_says_why(origin, make_node, session):
    from structlog.testing import capture_logs

    from cachenode.http.headers import MAX_STORED_HEADER_BYTES

    many = [(f"x-amz-meta-k{i}", "v" * 4000) for i in range(MAX_STORED_HEADER_BYTES // 4000 + 2)]
    origin.put(PATH, b"d" * 10, headers={"Cache-Control": "max-age=3600"}, fields=many)
    node = await make_node()
    with capture_logs() as logs:
        status, headers, body = await node.get(session, PATH)
    assert status == 200 and body == b"d" * 10 and headers["X-Nezha-Cache"] == "pass"
    assert fields_of(headers, {n for n, _ in many}) == expect(many)
    why = [e["reason"] for e in logs if e["event"] == "response_not_stored"]
    assert why and str(MAX_STORED_HEADER_BYTES) in why[0]
    assert len(node.node.store) == 0


async def test_hits_carry_the_caches_age_and_the_origins_date(origin, make_node, session):
    """RFC 9111 §5.1: Age is the cache's estimate, not the origin's replayed; RFC 9110 §6.6.1,
    RFC 9111 §4: Date is when the origin made the response, the same on every reuse."""
    from email.utils import formatdate
    import time

    generated = formatdate(time.time() - 50, usegmt=True)  # younger than its Age: Age rules (§4.2.3)
    origin.put(PATH, b"d" * 10, headers={"Cache-Control": "max-age=3600", "Age": "100", "Date": generated})
    node = await make_node()
    _, miss, _ = await node.get(session, PATH)
    assert miss["Age"] == "100"
    await node.node.settled()
    _, hit, _ = await node.get(session, PATH)
    assert hit.getall("Age") and 100 <= int(hit["Age"]) <= 102
    assert hit.getall("Date") == [generated] and miss.getall("Date") == [generated]


@pytest.mark.parametrize("kind", sorted(HEADER_CLASSES))
async def test_origin_fields_round_trip_through_a_relay_cold_and_warm(origin, cluster, session, kind):
    from tests.integration.cachenode.conftest import owner_and_other

    pairs = HEADER_CLASSES[kind]
    origin.put(PATH, b"d" * 4000, headers={"Cache-Control": "max-age=3600"}, fields=pairs)
    nodes, _ = await cluster(3)
    owners, others = owner_and_other(nodes, PATH)
    for label in ("peer-miss", "peer-hit"):
        status, headers, body = await nodes[others[0]].get(session, PATH)
        assert status == 200 and body == b"d" * 4000 and headers["X-Nezha-Cache"] == label
        assert fields_of(headers, {n for n, _ in pairs}) == expect(pairs), label
        await nodes[owners[0]].node.settled()


# -- every method ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND"])
async def test_every_method_reaches_the_origin_with_its_body_and_answer(origin, make_node, session, method):
    node = await make_node()
    payload = b"checkpoint-" * 1000
    async with session.request(method, node.url + "/ckpt/step-100.pt", data=payload,
                               headers={"Host": HOST, "Content-Type": "application/octet-stream"}) as r:
        body = await r.read()
        assert r.headers["X-Nezha-Cache"] == "pass", body
    import hashlib

    assert origin.uploads["/ckpt/step-100.pt"] == (len(payload), hashlib.sha256(payload).hexdigest())
    assert r.status == (204 if method == "DELETE" else 200)
    sent = {k.lower(): v for k, v in origin.raw_headers[-1]}
    assert sent["content-length"] == str(len(payload)), "object stores refuse uploads without a length"
    assert sent["content-type"] == "application/octet-stream"


async def test_a_chunked_upload_is_streamed_chunked(origin, make_node, session):
    node = await make_node()

    async def parts():
        for i in range(50):
            yield bytes([i]) * 10_000

    async with session.put(node.url + "/ckpt/a.bin", data=parts(), headers={"Host": HOST}) as r:
        assert r.status == 200
    assert origin.uploads["/ckpt/a.bin"][0] == 500_000
    assert {k.lower(): v for k, v in origin.raw_headers[-1]}["transfer-encoding"] == "chunked"


async def test_expect_100_continue_upload_gets_its_interim_answer_and_reaches_the_origin(origin, make_node):
    node = await make_node()
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(f"PUT /ckpt/e.bin HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\n"
                 "Expect: 100-continue\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
    writer.write(b"hello")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    writer.close()
    assert origin.uploads["/ckpt/e.bin"][0] == 5
    assert {k.lower(): v for k, v in origin.raw_headers[-1]}["expect"] == "100-continue"


async def test_expect_100_continue_lets_the_origin_refuse_before_the_body_is_sent(make_node, aiohttp_server):
    """boto3's PutObject sends Expect so a 403 or 307 comes back before a large body goes out."""
    from aiohttp import web

    from nezha.config import Origin

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=403, text="AccessDenied\n")

    async def handler(request: web.Request) -> web.Response:
        raise AssertionError("the body must not be asked for")

    app = web.Application()
    app.router.add_route("PUT", "/{tail:.*}", handler, expect_handler=refuse)
    server = await aiohttp_server(app, host="127.0.0.1")
    node = await make_node(origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{server.port}")])
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(f"PUT /ckpt/big.bin HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 52428800\r\n"
                 "Expect: 100-continue\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 403"), head
    writer.close()


async def test_put_then_get_of_the_same_url_is_not_served_stale_from_disk(origin, make_node, session):
    origin.put(PATH, b"version-1", headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    assert (await node.get(session, PATH))[1]["X-Nezha-Cache"] == "hit"
    async with session.put(node.url + PATH, data=b"version-2", headers={"Host": HOST}) as r:
        assert r.status == 200
    status, headers, body = await node.get(session, PATH)
    assert body == b"version-2" and headers["X-Nezha-Cache"] == "miss"


@pytest.mark.parametrize("status", [403, 500])
async def test_a_failed_write_invalidates_nothing(origin, make_node, session, aiohttp_server, status):
    """RFC 9111 §4.4 invalidates on a non-error status only: a refused PUT changed nothing."""
    from aiohttp import web

    from nezha.config import Origin

    async def handler(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.Response(body=b"kept", headers={"Cache-Control": "max-age=3600", "ETag": '"k"'})
        await request.read()
        return web.Response(status=status, text="no\n")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await aiohttp_server(app, host="127.0.0.1")
    node = await make_node(origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{server.port}")])
    await node.get(session, PATH)
    await node.node.settled()
    async with session.put(node.url + PATH, data=b"new", headers={"Host": HOST}) as r:
        assert r.status == status
    assert (await node.get(session, PATH))[1]["X-Nezha-Cache"] == "hit"


async def test_a_write_invalidates_the_location_it_names_on_the_same_host_only(origin, make_node, session,
                                                                                aiohttp_server):
    from aiohttp import web

    from nezha.config import Origin

    async def handler(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.Response(body=request.path.encode(), headers={"Cache-Control": "max-age=3600", "ETag": '"x"'})
        await request.read()
        return web.Response(status=201, headers={"Location": "/objects/new", "Content-Location": "/objects/alias"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await aiohttp_server(app, host="127.0.0.1")
    node = await make_node(origins=[Origin(host=HOST, upstream=f"http://127.0.0.1:{server.port}")])
    for path in ("/objects/new", "/objects/alias", "/objects/other"):
        await node.get(session, path)
    await node.node.settled()
    async with session.post(node.url + "/objects/", data=b"{}", headers={"Host": HOST}) as r:
        assert r.status == 201
    store = node.node.store
    assert f"http://{HOST}/objects/new" not in store and f"http://{HOST}/objects/alias" not in store
    assert f"http://{HOST}/objects/other" in store


async def test_a_post_invalidates_the_owners_copy_in_a_three_node_cluster(origin, cluster, session):
    from tests.integration.cachenode.conftest import owner_and_other

    origin.put(PATH, b"before", headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, PATH, replicas=2)
    await nodes[owners[0]].get(session, PATH)
    for nid in owners:
        await nodes[nid].node.settled()
    assert all(KEY in nodes[nid].node.store for nid in owners), "both owners hold it before the write"
    # The write enters through the one node that owns nothing.
    async with session.post(nodes[others[0]].url + PATH, data=b"after", headers={"Host": HOST}) as r:
        assert r.status == 200
    assert not any(KEY in nodes[nid].node.store for nid in owners)
    origin.put(PATH, b"after", headers={"Cache-Control": "max-age=3600"})
    status, headers, body = await nodes[others[0]].get(session, PATH)
    assert body == b"after" and headers["X-Nezha-Cache"] == "peer-miss"


async def test_a_cluster_is_one_cache_in_via_and_its_own_fields_stay_inside(origin, cluster, session):
    """The relaying node names itself; the owner behind it does not, and a replica's copy
    stores no owner's Via or X-Nezha-* field."""
    from tests.integration.cachenode.conftest import owner_and_other, until

    origin.put(PATH, b"v" * 1000, headers={"Cache-Control": "max-age=3600"}, fields=[("Via", "1.1 cdn")])
    nodes, _ = await cluster(3, replicas=2)
    owners, others = owner_and_other(nodes, PATH, replicas=2)
    for label in ("peer-miss", "peer-hit"):
        _, headers, _ = await nodes[others[0]].get(session, PATH)
        assert headers["X-Nezha-Cache"] == label
        assert headers.getall("Via") == [f"1.1 cdn, 1.1 {others[0]}"]
        assert "X-Nezha-Expires" not in headers
        await until(lambda: all(KEY in nodes[o].node.store for o in owners))
    _, headers, _ = await nodes[owners[1]].get(session, PATH)
    assert headers["X-Nezha-Cache"] == "hit" and headers.getall("Via") == [f"1.1 cdn, 1.1 {owners[1]}"]
    replica = nodes[owners[1]].node.store.lookup(KEY)
    assert [v for n, v in replica.headers if n.lower() == "via"] == ["1.1 cdn"]
    assert not [n for n, _ in replica.headers if n.lower().startswith("x-nezha")]


async def test_a_write_during_a_slow_fill_keeps_its_old_bytes_from_later_readers_and_the_store(
        origin, make_node, session):
    """GET A starts a slow fill; a PUT completes; GET B, sent after it, must not join A's
    (possibly older) fill, and what A's fill got is never stored."""
    origin.put(PATH, b"old!" * 250_000, headers={"Cache-Control": "max-age=3600"}, rate=2_000_000)
    node = await make_node()
    reader = asyncio.get_running_loop().create_task(node.get(session, PATH))
    await asyncio.sleep(0.1)  # A's body is streaming
    async with session.put(node.url + PATH, data=b"new!" * 10, headers={"Host": HOST}) as r:
        assert r.status == 200
    status, headers, body = await node.get(session, PATH)
    assert body == b"new!" * 10 and headers["X-Nezha-Cache"] == "miss"
    status, headers, old = await reader
    assert old == b"old!" * 250_000, "the reader that came first still gets a whole answer"
    await node.node.settled()
    status, headers, body = await node.get(session, PATH)
    assert body == b"new!" * 10 and headers["X-Nezha-Cache"] == "hit"


@pytest.mark.parametrize("target,max_forwards,answered_here", [
    ("/any", "0", True), ("*", None, True), ("/any", "3", False)])
async def test_options_stops_here_only_at_its_last_hop_or_for_the_whole_server(origin, make_node, target,
                                                                                max_forwards, answered_here):
    """RFC 9110 §7.6.2, §9.3.7: Max-Forwards 0 is answered by this hop; others are forwarded, decremented."""
    node = await make_node()
    hops = f"Max-Forwards: {max_forwards}\r\n" if max_forwards else ""
    reader, writer = await asyncio.open_connection("127.0.0.1", node.server.port)
    writer.write(f"OPTIONS {target} HTTP/1.1\r\nHost: {HOST}\r\n{hops}\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200") or not answered_here, head
    if answered_here:
        assert b"Allow: " in head and sum(origin.requests.values()) == 0
    else:
        assert {k.lower(): v for k, v in origin.raw_headers[-1]}["max-forwards"] == "2"


async def test_what_an_owner_tells_the_relaying_node_of_a_large_object_stays_inside(origin, cluster, session):
    """Block checksums and expiry are for a peer's copy: a client reading through a relay sees none of them."""
    from tests.integration.cachenode.conftest import owner_and_other

    origin.put(PATH, b"b" * 300_000, headers={"Cache-Control": "max-age=3600"})
    nodes, _ = await cluster(2)
    _, others = owner_and_other(nodes, PATH)
    for label in ("peer-miss", "peer-hit"):
        _, headers, body = await nodes[others[0]].get(session, PATH)
        assert headers["X-Nezha-Cache"] == label and body == b"b" * 300_000
        assert not {"X-Nezha-Expires", "X-Nezha-Blocks", "X-Nezha-Authorize", "X-Nezha-Digest"} & set(headers)
