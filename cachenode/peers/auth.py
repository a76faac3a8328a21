"""Who is a peer: the one rule for the internal endpoints and for relayed requests.

A node of a cluster shares a cluster token with its peers; a request proves
it comes from one by carrying that token in `X-Nezha-Token`. A lone node
(no token: `nezha cache` without `--redis-url`, or a test) trusts loopback
callers instead, since nothing else can share its machine's loopback. A
node that joins a cluster refuses to start without a token (cachenode/cli.py),
so the loopback rule never applies behind a sidecar proxy that delivers every
client from 127.0.0.6.

`X-Nezha-Peer` (a request relayed by another node) counts only under the same
rule: a client that sends it is still a client, its request asks the key's
owners and is counted in the statistics.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping

from aiohttp import web

from nezha.wire import PEER_HEADER, TOKEN_HEADER


def refuse_internal(*, remote: str | None, token: str | None, presented: str | None) -> str | None:
    """Why an internal request must be refused, or None to allow it."""
    if token:
        if presented is None:
            return f"internal endpoint needs the cluster token in {TOKEN_HEADER}"
        if not hmac.compare_digest(presented.encode(), token.encode()):
            return f"wrong cluster token in {TOKEN_HEADER}"
        return None
    try:
        loopback = remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return f"internal endpoints answer {remote} only when cluster_token is set on this node"
    return None


def from_peer(headers: Mapping[str, str], *, remote: str | None, token: str | None) -> bool:
    """Whether a request that names itself relayed (`X-Nezha-Peer`) really comes from a peer."""
    if PEER_HEADER not in headers:
        return False
    return refuse_internal(remote=remote, token=token, presented=headers.get(TOKEN_HEADER)) is None


def peer_auth(token: str | None) -> dict[str, str]:
    """The header a node adds to what it sends its peers."""
    return {TOKEN_HEADER: token} if token else {}


_FROM_PEER = web.RequestKey("nezha_from_peer", bool)


def is_peer_request(request: web.Request, token: str | None) -> bool:
    """`from_peer` for an aiohttp request, decided once and kept on it."""
    decided = request.get(_FROM_PEER)
    if decided is None:
        decided = from_peer(request.headers, remote=request.remote, token=token)
        request[_FROM_PEER] = decided
    return decided
