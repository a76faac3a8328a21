"""The main promise: the second download is a hit with the same bytes."""

import pytest


async def test_second_download_is_a_hit_with_same_bytes(origin, make_node, session):
    body = bytes(range(256)) * 4000
    origin.put("/~kriz/data.tar.gz", body)
    node = await make_node()
    s1, h1, b1 = await node.get(session, "/~kriz/data.tar.gz")
    await node.node.settled()
    s2, h2, b2 = await node.get(session, "/~kriz/data.tar.gz")
    assert (s1, s2) == (200, 200)
    assert b1 == body and b2 == body
    assert h1["X-Nezha-Cache"] == "miss" and h2["X-Nezha-Cache"] == "hit"
    assert h2["ETag"] == origin.etags["/~kriz/data.tar.gz"]
    assert origin.requests["/~kriz/data.tar.gz"] == 1


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile", "read-write"])
async def test_client_hanging_up_mid_hit_is_logged_once_as_client_gone(origin, make_node, session, caplog, sendfile):
    """A hit cut short by its client is an info line with the bytes sent, not a 500 with a traceback.

    Served by aiohttp (front/respond.py), not the fast path, which has its own writer."""
    from structlog.testing import capture_logs

    from tests.integration.cachenode.conftest import hang_up_after, logged, until

    body = bytes(range(256)) * 160_000  # 40 MB: more than the socket buffers hold
    origin.put("/big.tar", body)
    node = await make_node(sendfile=sendfile, fast_hits=False)
    await node.get(session, "/big.tar")
    await node.node.settled()
    with capture_logs() as logs:
        await hang_up_after(node, "/big.tar", 100_000)
        await until(logged(logs, "request_completed"))  # the server notices at its next send
    gone = [e for e in logs if e["event"] == "client_gone"]
    assert len(gone) == 1 and gone[0]["log_level"] == "info", logs
    assert gone[0]["bytes"] < len(body)
    done = [e for e in logs if e["event"] == "request_completed"]
    assert [(e["status"], e["cache"], e["bytes"]) for e in done] == [(200, "hit", gone[0]["bytes"])]
    assert not [e for e in logs if e["log_level"] in ("warning", "error", "critical")], logs
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    status, headers, got = await node.get(session, "/big.tar")
    assert got == body and headers["X-Nezha-Cache"] == "hit"
