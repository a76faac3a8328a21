"""The node's origin client keeps no cookies: a `Set-Cookie` an origin answers
one client with goes to that client alone, and is never sent back to the
origin on a later request, whoever makes it. A cookie jar in the node's
client would hand one job's session to every other job the node fills for
(the transparency contract: every end-to-end field is kept both ways, and
nothing is added)."""

from __future__ import annotations

from aiohttp import web

from cachenode.fill.origin import OriginClient


async def test_a_cookie_an_origin_sets_is_never_sent_back_on_a_later_request(aiohttp_server):
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        return web.Response(body=b"x", headers={"Set-Cookie": "session=secret; Path=/"})

    app = web.Application()
    app.router.add_get("/{name}", answer)
    server = await aiohttp_server(app, host="127.0.0.1")
    # A name, not an address: aiohttp's default cookie jar keeps no cookie of an IP address.
    base = f"http://localhost:{server.port}"
    client = OriginClient(connect_timeout=5, read_timeout=5)
    await client.start()
    try:
        for name, headers in (("a", {}), ("b", {}), ("c", {"Cookie": "mine=1"})):
            response = await client.request("GET", f"{base}/{name}", headers=headers, what=f"origin {base}")
            assert response.headers["Set-Cookie"] == "session=secret; Path=/"
            await response.read()
            response.release()
    finally:
        await client.close()
    assert seen == [None, None, "mine=1"]
