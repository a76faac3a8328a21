"""TTL, revalidation, and stale copies when the origin is down."""

PATH = "/datasets/mnist.npz"
KEY = "http://www.cs.toronto.edu" + PATH


async def test_expired_object_revalidated_by_304_is_kept(origin, make_node, session):
    origin.put(PATH, b"v1" * 1000, headers={"Cache-Control": "max-age=0"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    status, headers, got = await node.get(session, PATH)
    assert status == 200 and got == b"v1" * 1000 and headers["X-Nezha-Cache"] == "revalidated"
    assert origin.request_headers[-1]["If-None-Match"] == origin.etags[PATH]
    assert origin.requests[PATH] == 2


async def test_changed_etag_replaces_the_stored_object(origin, make_node, session):
    origin.put(PATH, b"old" * 1000, headers={"Cache-Control": "max-age=0"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"new!" * 1000, headers={"Cache-Control": "max-age=600"})
    status, headers, got = await node.get(session, PATH)
    assert got == b"new!" * 1000
    await node.node.settled()
    status, headers, got = await node.get(session, PATH)
    assert got == b"new!" * 1000 and headers["X-Nezha-Cache"] == "hit"
    assert headers["ETag"] == origin.etags[PATH]
    # settled() also waits for the replaced data file's unlink, done in the background.
    assert len([p for p in node.node.store.objects.rglob("*") if p.suffix in (".data", ".obj")]) == 1


async def test_max_age_keeps_object_fresh_without_asking_origin(origin, make_node, session):
    origin.put(PATH, b"f" * 10, headers={"Cache-Control": "max-age=3600"})
    node = await make_node()
    for _ in range(3):
        await node.get(session, PATH)
        await node.node.settled()
    assert origin.requests[PATH] == 1


async def test_stale_copy_is_served_with_a_warning_when_origin_is_down(origin, make_node, session):
    origin.put(PATH, b"stale" * 100, headers={"Cache-Control": "max-age=0"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"x", status=503, headers={"Cache-Control": "max-age=0"})
    status, headers, got = await node.get(session, PATH)
    assert status == 200 and got == b"stale" * 100
    assert headers["X-Nezha-Cache"] == "stale" and "Revalidation Failed" in headers["Warning"]


async def test_stale_copy_is_served_when_origin_is_unreachable(origin, make_node, session, tmp_path):
    from nezha.config import Origin

    origin.put(PATH, b"keep" * 100, headers={"Cache-Control": "max-age=0"})
    node = await make_node(data_dir=tmp_path / "d")
    await node.get(session, PATH)
    await node.node.settled()
    await node.server.close()
    dead = await make_node(data_dir=tmp_path / "d",
                           origins=[Origin(host="www.cs.toronto.edu", upstream="http://127.0.0.1:9")])
    status, headers, got = await dead.get(session, PATH)
    assert status == 200 and got == b"keep" * 100 and headers["X-Nezha-Cache"] == "stale"


async def test_must_revalidate_object_is_not_served_stale(origin, make_node, session):
    origin.put(PATH, b"m" * 10, headers={"Cache-Control": "max-age=0, must-revalidate"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"down", status=503)
    status, _, got = await node.get(session, PATH)
    assert status == 503 and got == b"down"


async def test_no_store_and_private_responses_pass_through_unstored(origin, make_node, session):
    origin.put("/a", b"secret-a", headers={"Cache-Control": "private"})
    origin.put("/b", b"secret-b", headers={"Cache-Control": "no-store"})
    node = await make_node()
    for path, body in (("/a", b"secret-a"), ("/b", b"secret-b")):
        for _ in range(2):
            status, headers, got = await node.get(session, path)
            assert got == body and headers["X-Nezha-Cache"] == "pass"
        assert origin.requests[path] == 2
    assert len(node.node.store) == 0


async def test_authorization_and_cookie_requests_bypass_the_cache(origin, make_node, session):
    origin.put(PATH, b"public" * 10)
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    for creds in ({"Authorization": "Bearer alice"}, {"Cookie": "session=bob"}):
        status, headers, got = await node.get(session, PATH, headers=creds)
        assert headers["X-Nezha-Cache"] == "bypass"
        sent = origin.request_headers[-1]
        assert all(sent.get(k) == v for k, v in creds.items()), "credentials must reach the origin"
    origin.put("/private", b"alice-only")
    await node.get(session, "/private", headers={"Authorization": "Bearer alice"})
    await node.node.settled()
    assert "http://www.cs.toronto.edu/private" not in node.node.store
    assert origin.requests[PATH] == 3


async def test_pass_through_bytes_are_counted_in_metrics_and_index_stats(origin, make_node, session, redis_server):
    """Bypass, unstorable, over-capacity and origin-error answers are traffic too: bytes served and fetched."""
    origin.put("/bypass", b"b" * 1000)
    origin.put("/nostore", b"n" * 2000, headers={"Cache-Control": "no-store"})
    origin.put("/big", b"B" * 200_000)
    node = await make_node(capacity=100_000, redis_url=redis_server.url, node_id="nezha-cache-0")
    expect = [("/bypass", {"Authorization": "Bearer alice"}, "bypass", 1000), ("/nostore", {}, "pass", 2000),
              ("/missing", {}, "pass", len(b"no /missing\n")), ("/big", {}, "pass", 200_000)]
    for path, headers, label, size in expect:
        status, got_headers, got = await node.get(session, path, headers=headers)
        assert got_headers["X-Nezha-Cache"] == label and len(got) == size
    await node.node.settled()
    total = sum(size for *_, size in expect)
    async with session.get(node.url + "/metrics") as r:
        text = await r.text()
    assert f"nezha_bytes_served_total {float(total)}" in text
    assert f"nezha_bytes_from_origin_total {float(total)}" in text
    assert await node.node.index.flush()
    stats = await node.node.index.read_stats()
    for scope in (stats["nodes"]["nezha-cache-0"], stats["hosts"]["www.cs.toronto.edu"], stats["cluster"]):
        assert scope["bytes_served"] == total and scope["bytes_from_origin"] == total, scope
        assert scope["hits"] == 0 and scope["misses"] == 0
    assert len(node.node.store) == 0


async def test_client_hanging_up_mid_pass_through_is_client_gone_with_its_bytes_counted(origin, make_node, session):
    """An unstorable response cut short by its client: one info line, the bytes that left counted."""
    from structlog.testing import capture_logs

    from tests.integration.cachenode.conftest import hang_up_after, logged, until

    origin.put("/nostore", b"n" * 2_000_000, rate=1_000_000, headers={"Cache-Control": "no-store"})
    node = await make_node()
    with capture_logs() as logs:
        await hang_up_after(node, "/nostore", 10_000)
        await until(logged(logs, "request_completed"))  # the node notices at its next write
    assert [e["cache"] for e in logs if e["event"] == "request_completed"] == ["pass"]
    gone = [e for e in logs if e["event"] == "client_gone"]
    assert len(gone) == 1 and gone[0]["log_level"] == "info", logs
    assert 10_000 <= gone[0]["bytes"] < 2_000_000
    assert [(e["status"], e["bytes"]) for e in logs if e["event"] == "request_completed"] == [(200, gone[0]["bytes"])]
    assert not [e for e in logs if e["log_level"] in ("warning", "error", "critical")], logs
    async with session.get(node.url + "/metrics") as r:
        assert f"nezha_bytes_served_total {float(gone[0]['bytes'])}" in await r.text()


async def test_a_revalidation_304_with_age_grants_only_what_is_left_of_max_age(origin, make_node, session):
    """A 304 from a shared cache upstream, 500 s old with max-age=600: fresh for about 100 s, not 600."""
    import time

    origin.put(PATH, b"a" * 1000, headers={"Cache-Control": "max-age=0"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"a" * 1000, headers={"Cache-Control": "max-age=600", "Age": "500"})
    status, headers, got = await node.get(session, PATH)
    assert status == 200 and headers["X-Nezha-Cache"] == "revalidated"
    left = node.node.store.lookup(f"http://www.cs.toronto.edu{PATH}").expires_at - time.time()
    assert 90 < left <= 100
