

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
