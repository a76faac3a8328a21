"""RFC 9111 and RFC 5861 as a client sees them: which requests reach the origin.

Each row is a response's Cache-Control (and Age), a request's own
directives, and what the second request must meet: a hit from disk, a
revalidation (a conditional request to the origin, answered 304), or a stale
copy served without asking.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.cachenode.conftest import until

PATH = "/datasets/labels.csv"


@pytest.mark.parametrize("response,request_headers,label,origin_requests", [
    # The response's own lifetime.
    ({"Cache-Control": "max-age=3600"}, {}, "hit", 1),
    ({"Cache-Control": "max-age=0"}, {}, "revalidated", 2),
    ({"Cache-Control": "no-cache"}, {}, "revalidated", 2),
    ({"Cache-Control": "max-age=0, s-maxage=3600"}, {}, "hit", 1),  # a shared cache obeys s-maxage
    ({"Cache-Control": "max-age=3600, s-maxage=0"}, {}, "revalidated", 2),
    ({"Cache-Control": "max-age=60", "Age": "100"}, {}, "revalidated", 2),  # older than its lifetime already
    ({"Expires": "0"}, {}, "revalidated", 2),  # an invalid Expires means already expired
    ({"Expires": "Thu, 01 Jan 2099 00:00:00 GMT"}, {}, "hit", 1),
    ({}, {}, "hit", 1),  # Last-Modified, no lifetime: heuristic freshness
    # The request's directives.
    ({"Cache-Control": "max-age=3600"}, {"Cache-Control": "no-cache"}, "revalidated", 2),
    ({"Cache-Control": "max-age=3600"}, {"Cache-Control": "max-age=0"}, "revalidated", 2),
    ({"Cache-Control": "max-age=3600"}, {"Pragma": "no-cache"}, "revalidated", 2),
    ({"Cache-Control": "max-age=3600"}, {"Pragma": "no-cache", "Cache-Control": "max-stale"}, "hit", 1),
    ({"Cache-Control": "max-age=3600"}, {"Cache-Control": "min-fresh=7200"}, "revalidated", 2),
    ({"Cache-Control": "max-age=3600", "Age": "600"}, {"Cache-Control": "max-age=300"}, "revalidated", 2),
    ({"Cache-Control": "max-age=3600", "Age": "600"}, {"Cache-Control": "max-age=900"}, "hit", 1),
    ({"Cache-Control": "max-age=10", "Age": "100"}, {"Cache-Control": "max-stale=3600"}, "hit", 1),
    ({"Cache-Control": "max-age=10, must-revalidate", "Age": "100"}, {"Cache-Control": "max-stale"},
     "revalidated", 2),
])
async def test_second_request_is_answered_as_the_rfc_says(origin, make_node, session, response, request_headers,
                                                           label, origin_requests):
    origin.put(PATH, b"a,b\n" * 100, headers=response)
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    status, headers, body = await node.get(session, PATH, headers=request_headers)
    assert status == 200 and body == b"a,b\n" * 100
    assert headers["X-Nezha-Cache"] == label
    assert origin.requests[PATH] == origin_requests
    if label == "revalidated":
        assert origin.request_headers[-1]["If-None-Match"] == origin.etags[PATH]


async def test_sequential_requests_for_a_no_cache_object_each_revalidate(origin, make_node, session):
    """Each request starts after the previous one completed: none may join a fill that already ended."""
    origin.put(PATH, b"x" * 200_000, headers={"Cache-Control": "no-cache"})
    node = await make_node()
    labels = []
    for _ in range(3):
        status, headers, body = await node.get(session, PATH)
        assert status == 200 and len(body) == 200_000
        labels.append(headers["X-Nezha-Cache"])
    assert labels[0] == "miss" and labels[1:] == ["revalidated", "revalidated"]
    assert origin.requests[PATH] == 3


async def test_a_request_after_the_body_arrived_but_before_it_was_stored_is_no_joiner(origin, make_node, session,
                                                                                       monkeypatch):
    """The window between the last byte and the commit: the request waits for the commit, then is judged.
    A body above the small objects' size: a small one that came whole is stored before it is answered
    (cachenode/fill/at_once.py), so its first client would wait on the held commit."""
    from cachenode.store.disk import Store

    origin.put(PATH, b"y" * 300_000, headers={"Cache-Control": "no-cache"})
    node = await make_node()
    commit = Store.commit
    gate = asyncio.Event()

    async def slow_commit(self, temp, meta, **kw):
        await gate.wait()
        return await commit(self, temp, meta, **kw)

    monkeypatch.setattr(Store, "commit", slow_commit)
    first = await node.get(session, PATH)  # its whole body arrives; the commit is held
    assert first[1]["X-Nezha-Cache"] == "miss"
    second = asyncio.get_running_loop().create_task(node.get(session, PATH))
    await asyncio.sleep(0.1)
    assert not second.done(), "it waits for the store instead of joining the finished fill"
    gate.set()
    status, headers, body = await second
    assert headers["X-Nezha-Cache"] == "revalidated" and body == b"y" * 300_000
    assert origin.requests[PATH] == 2


@pytest.mark.parametrize("cache_control", ["no-store", "private", "max-age=60"])
async def test_concurrent_requests_share_only_a_storable_response(origin, make_node, session, cache_control):
    """An unstorable response is one client's: each concurrent request gets its own from the origin."""
    origin.put(PATH, b"z" * 1000, headers={"Cache-Control": cache_control}, delay=0.2)
    node = await make_node()
    results = await asyncio.gather(*(node.get(session, PATH) for _ in range(3)))
    assert all(body == b"z" * 1000 for _, _, body in results)
    labels = sorted(h["X-Nezha-Cache"] for _, h, _ in results)
    if cache_control == "max-age=60":
        assert labels == ["miss", "miss-joined", "miss-joined"] and origin.requests[PATH] == 1
    else:
        assert labels == ["pass"] * 3 and origin.requests[PATH] == 3


async def test_stale_while_revalidate_serves_at_once_and_refreshes_behind(origin, make_node, session):
    origin.put(PATH, b"old" * 100, headers={"Cache-Control": "max-age=1, stale-while-revalidate=600",
                                             "Age": "5"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"new" * 100, headers={"Cache-Control": "max-age=600"}, delay=0.3)
    status, headers, body = await node.get(session, PATH)
    assert body == b"old" * 100 and headers["X-Nezha-Cache"] == "stale"  # not waiting for the slow origin
    await until(lambda: origin.requests[PATH] == 2)
    await node.node.settled()
    status, headers, body = await node.get(session, PATH)
    assert body == b"new" * 100 and headers["X-Nezha-Cache"] == "hit"
    assert origin.requests[PATH] == 2


@pytest.mark.parametrize("cache_control,age,served_stale", [
    ("max-age=10", "100", True),  # nothing forbids it: a dataset beats a 502
    ("max-age=10, stale-if-error=1000", "100", True),
    ("max-age=10, stale-if-error=30", "100", False),  # 90 s past expiry, 30 allowed
    ("max-age=10, must-revalidate", "100", False),
    ("max-age=10, proxy-revalidate", "100", False),
    ("s-maxage=10", "100", False),  # s-maxage implies proxy-revalidate (RFC 9111 §5.2.2.10)
    ("no-cache", "0", False),
])
async def test_a_stale_copy_answers_an_origin_error_only_where_allowed(origin, make_node, session, cache_control,
                                                                        age, served_stale):
    origin.put(PATH, b"s" * 100, headers={"Cache-Control": cache_control, "Age": age})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"down\n", status=503)
    status, headers, body = await node.get(session, PATH)
    if served_stale:
        assert status == 200 and body == b"s" * 100 and headers["X-Nezha-Cache"] == "stale"
    else:
        assert status == 503 and body == b"down\n"


async def test_only_if_cached_is_504_for_what_is_not_on_disk_and_never_asks_the_origin(origin, make_node, session):
    origin.put(PATH, b"o" * 10, headers={"Cache-Control": "max-age=60"})
    node = await make_node()
    status, _, _ = await node.get(session, PATH, headers={"Cache-Control": "only-if-cached"})
    assert status == 504 and origin.requests[PATH] == 0
    await node.get(session, PATH)
    await node.node.settled()
    status, headers, _ = await node.get(session, PATH, headers={"Cache-Control": "only-if-cached"})
    assert status == 200 and headers["X-Nezha-Cache"] == "hit"


async def test_a_304_that_adds_must_revalidate_ends_stale_answers_on_error(origin, make_node, session):
    """RFC 9111 §3.2: the refreshed fields, not the first response's, rule the stored copy."""
    origin.put(PATH, b"r" * 100, headers={"Cache-Control": "max-age=0"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"r" * 100, headers={"Cache-Control": "max-age=0, must-revalidate"})
    assert (await node.get(session, PATH))[1]["X-Nezha-Cache"] == "revalidated"
    origin.put(PATH, b"down\n", status=503)
    status, _, body = await node.get(session, PATH)
    assert status == 503 and body == b"down\n"


async def test_a_304_that_makes_the_response_private_serves_this_request_and_keeps_nothing(
        origin, make_node, session):
    origin.put(PATH, b"p" * 100, headers={"Cache-Control": "max-age=0"})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    origin.put(PATH, b"p" * 100, headers={"Cache-Control": "private"})
    status, headers, body = await node.get(session, PATH)
    assert status == 200 and body == b"p" * 100
    await node.node.settled()
    assert f"http://www.cs.toronto.edu{PATH}" not in node.node.store


async def test_a_response_generated_long_ago_is_as_old_as_its_date_says(origin, make_node, session):
    """RFC 9111 §4.2.3: apparent age (arrival - Date) counts even without Age."""
    from email.utils import formatdate
    import time

    origin.put(PATH, b"d" * 10, headers={"Date": formatdate(time.time() - 7200, usegmt=True),
                                         "Expires": formatdate(time.time() - 3600, usegmt=True)})
    node = await make_node()
    await node.get(session, PATH)
    await node.node.settled()
    assert (await node.get(session, PATH))[1]["X-Nezha-Cache"] == "revalidated"


async def test_a_request_with_no_store_stores_nothing(origin, make_node, session):
    origin.put(PATH, b"n" * 100, headers={"Cache-Control": "max-age=600"})
    node = await make_node()
    _, headers, _ = await node.get(session, PATH, headers={"Cache-Control": "no-store"})
    await node.node.settled()
    assert headers["X-Nezha-Cache"] == "pass" and len(node.node.store) == 0
    await node.get(session, PATH)
    await node.node.settled()
    _, headers, _ = await node.get(session, PATH, headers={"Cache-Control": "no-store"})
    assert headers["X-Nezha-Cache"] == "hit", "it may still be answered from what is stored"


@pytest.mark.parametrize("why", ["no-store", "over-capacity"])
@pytest.mark.parametrize("asked,status,length", [
    ({"Range": "bytes=0-9"}, 206, 10),
    ({"If-Match": '"not-it"'}, 412, 0),
    ("etag", 304, 0),
])
async def test_a_response_that_is_not_stored_still_honours_the_clients_range_and_validators(
        origin, make_node, session, why, asked, status, length):
    """The fill asked without them; the client gets what the origin gives its own request."""
    headers = {"Cache-Control": "no-store"} if why == "no-store" else {"Cache-Control": "max-age=60"}
    origin.put(PATH, b"b" * 200_000, headers=headers)
    node = await make_node(capacity=100_000)
    sent = {"If-None-Match": origin.etags[PATH]} if asked == "etag" else asked
    got_status, got_headers, body = await node.get(session, PATH, headers=sent)
    assert got_status == status and len(body) == length and got_headers["X-Nezha-Cache"] == "pass"
