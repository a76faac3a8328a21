"""Relaying a request to the key's owner, with failover that a job never notices.

Only the first live owner of a key fills it from the origin. A node asks
the owners *ahead of it* in ring order (every owner, for a non-owner; the
ones before it, for a replica) and streams the first answer both ways; if
none answers, the caller serves the request itself, so the next owner in
order becomes the filler when the first is down.

Failover, in the order a request meets it:

- **No answer.** A refused connection, a connect that takes longer than
  its budget, or a connection closed before the headers is followed by a
  liveness probe: an owner that fails it too is marked down for a few
  seconds (tried last, not skipped) and the loop moves on to the next; one
  that answers it is asked once more, and moved on from for this request
  alone if that fails too (peers/asks.py `ask`). An owner's own 5xx moves
  on and marks it down at once. An owner that answered within the last
  `ANSWERED_WITHIN` seconds is given `RECENT_CONNECT` times `peer_timeout`
  to connect (and to be probed): on a saturated link a new connection's
  SYN is dropped and sent again a second later, and a stampede marked busy
  owners down for it and read their chunks from the origin
  (docs/benchmarks.md, "Stampede"). A 5xx the owner
  passes on from the origin (`X-Nezha-Cache: pass`, or `X-Nezha-Origin-Error`
  on the owner's own 502/504) goes to the client as it is: asking another
  owner would only ask the same origin again.
- **Silence before the headers.** A hot owner answers within `peer_timeout`;
  a cold one sends its headers as soon as the origin sent its own, so it may
  legitimately wait up to the origin's connect plus read timeouts. The relay
  tells the two apart by asking the silent owner's `/healthz` (a liveness
  probe, bounded by `peer_timeout`) after each `peer_timeout` of silence: a
  frozen or wedged owner fails it and is given up after about twice
  `peer_timeout`; a live one is waited for up to `header_timeout`.
- **Silence or death mid-body.** The same probe runs whenever the body
  stops moving for `peer_timeout`; an owner that fails it is cut off. A body
  that breaks is resumed from the next owner with `Range: bytes=<sent>-`
  pinned by `If-Range` (a strong ETag, else a Last-Modified at least a second
  older than the response's Date, RFC 9110 §13.1.5), and when no owner is
  left, from the origin with the same two headers, so the client sees one
  unbroken response. Only when neither is possible is the client's
  connection cut: never a short body. An owner that broke off is marked
  down, unless it says it cut the body because its own fill failed (the
  origin died mid-body; `peer_fill_failed`): the relay asks it at once
  (peers/cuts.py), and a node that does not answer, or cut nothing, is
  down. A live owner is not routed around for its origin's failure.
- **The filling owner dies under a stampede.** Every client relayed from it
  breaks at once. Those relayed through a non-owner resume from the next
  owner, whose flight serves them all. Those relayed through that next
  owner itself join the same flight: the node asks itself for the rest (as
  a peer would, so the request meets the flight like any other) before it
  would ask the origin. So the origin gets one resume for the missing range,
  not one per client, and the flight keeps what it fetched
  (cachenode/fill/parallel.py, a fill led by a resume).
- **An owner that cuts wrong bytes.** An owner whose fill fails its digest
  check cuts its clients before the last byte, which looks here exactly like
  an owner dying mid-body, so the rest is resumed as above. The resumed body
  may then join the wrong bytes already sent to a right rest. So a relayed
  200 from an owner's fill in progress whose head carries a whole-object
  digest (`http/digests.py`, or the one the owner's fill checks, handed on
  in `X-Nezha-Digest`) is checked here too, across every resume, and the
  client is kept from its last byte until the check passes: on a mismatch
  its connection is cut (no clean end, no last chunk), and `digest_mismatch`
  is logged (source `relay`) and counted as a fill's is. Such a body goes
  through Python, not the kernel's splice (fill/streamed_digest.py). An
  owner's hit is spliced unhashed: its bytes were checked when stored, and
  nothing cuts a hit for a wrong byte. Every resume hands the digest on, so
  the fill it leads at the next owner checks the whole object; a spliced
  body resumed from the origin is checked whole by reading its head again
  (front/relay_resume.py).

Relayed requests carry `X-Nezha-Peer`; a node never relays such a request
again, so each request crosses at most one peer hop even when two nodes
disagree about the ring.

Where each rule lives: this module is the loop over owners; talking to one
owner (the connect budget, down marks, the liveness probe before the
headers and mid-body) is peers/asks.py; the body promised to the
client (its span, its validator, its digest check, its clean end) is
front/relay_body.py; the rest of a body no owner ahead could finish (this
node's own flight, then the origin) is front/relay_resume.py.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import aiohttp
import structlog
from aiohttp import web

from cachenode.kernel import splice
from nezha.ring import Peer
from cachenode.front.interim import InterimRelay
from cachenode.peers.asks import PeerAsks, from_origin
from cachenode.front.relay_body import RelayedBody, client_gone, finish_body, start_body, stream_body
from cachenode.front.relay_resume import headers_for, unfinished
from nezha.keys import Target
from nezha.errors import OriginError
from nezha.wire import CHUNKED_HEADER, DIGEST_HEADER
from cachenode.http.digests import carry

log = structlog.get_logger("nezha.peers")

# Answers a relayed request whose owner sent a chunked object's manifest; None: it could not.
OnManifest = Callable[[web.Request, aiohttp.ClientResponse, Peer], Awaitable[web.StreamResponse | None]]
# Sees the first owner answer's head before it is relayed; answers the request
# itself (a hot copy the owner's 304 renewed), or None: relay the answer on.
OnAnswer = Callable[[web.Request, aiohttp.ClientResponse, Peer], Awaitable[web.StreamResponse | None]]
# Sees the first owner answer's head after `OnAnswer`, and may take the answer
# whole (its body becomes this node's copy, cluster/streaming_copies.py): an
# answer it returns was served from what it took, and the owner's answer is
# its own from then on (its fill reads the body): the relay does not release it.
OnHead = Callable[[web.Request, aiohttp.ClientResponse, Peer], Awaitable[web.StreamResponse | None]]


def resumed(body: RelayedBody, r: aiohttp.ClientResponse, peer: Peer, *, target: Target) -> bool:
    """Whether `peer`'s answer `r` carries `body` on from where it broke off;
    logged either way, so a client's one response read from several owners
    can be followed in the logs."""
    if not body.continues(r):
        log.warning("peer_resume_refused", peer=peer.id, status=r.status,
                    content_range=r.headers.get("Content-Range"), path=target.path)
        return False
    log.info("peer_resumed", peer=peer.id, offset=body.start + body.sent, path=target.path)
    return True


class PeerRelay(PeerAsks):
    """The relay: a client's request asked of the key's owners in order, and
    the first answer streamed back, resumed elsewhere when it breaks."""

    async def relay(self, request: web.Request, owners: list[Peer], *, target: Target,
                    origin_url: str | None = None, on_manifest: OnManifest | None = None,
                    validators: dict[str, str] | None = None,
                    on_answer: OnAnswer | None = None, here: Peer | None = None,
                    on_head: OnHead | None = None) -> web.StreamResponse | None:
        """Serve `request` from an owner. None when no owner answered at all.

        `here`: this node, when it owns the key too; a body that broke with
        no owner ahead left is resumed from this node's own flight first.

        `origin_url` is where to fetch the rest of a body that broke with no
        owner left to resume from. `on_manifest` answers the request when an
        owner answers with a chunked object's manifest (CHUNKED_HEADER) instead
        of its bytes (cachenode/chunks/reads.py). `validators` replace the
        client's If-None-Match and If-Modified-Since (a hot copy's revalidation,
        cluster/hot_revalidation.py), and `on_answer` sees the owner's answer first;
        `on_head` then, and it may take it (this node's copy of it).
        """
        interim = InterimRelay(request)
        try:
            return await self._relay(request, owners, target=target, origin_url=origin_url, interim=interim,
                                     on_manifest=on_manifest, validators=validators, on_answer=on_answer, here=here,
                                     on_head=on_head)
        finally:
            interim.close()

    async def _ask_owner(self, request: web.Request, peer: Peer, *, target: Target,
                         validators: dict[str, str] | None, body: RelayedBody | None,
                         interim: InterimRelay) -> aiohttp.ClientResponse | None:
        """`peer` asked for the relayed request, or for the rest of `body` once one
        is under way; None when it did not answer, so the loop over owners goes
        on to the next (`ask` marked it down if its liveness probe failed too)."""
        headers = headers_for(self, request, target, validators=validators, body=body)
        handed = self.linked.linked(target) if body is None and self.linked is not None else None
        if handed is not None:
            # A Hugging Face redirect this node passed on named the file's sha256: its owner checks it.
            headers[DIGEST_HEADER] = carry(handed)
        try:
            return await self.ask(peer, request.method, peer.url + target.path_qs, headers=headers,
                                  interim=interim if body is None else None)
        except OriginError as e:
            log.info("peer_passed_over", peer=peer.id, path=target.path, reason=str(e), down=self.is_down(peer))
            return None

    async def _relay(self, request: web.Request, owners: list[Peer], *, target: Target, origin_url: str | None,
                     interim: InterimRelay, on_manifest: OnManifest | None = None,
                     validators: dict[str, str] | None = None,
                     on_answer: OnAnswer | None = None, here: Peer | None = None,
                     on_head: OnHead | None = None) -> web.StreamResponse | None:
        body: RelayedBody | None = None
        for peer in self.order(owners):
            if peer.id == self.node_id:
                continue
            if body is not None and not body.resumable:
                break
            r = await self._ask_owner(request, peer, target=target, validators=validators, body=body,
                                      interim=interim)
            if r is None:
                continue
            taken = False  # by `on_head`: its fill reads the body, so it is not released here
            try:
                if body is None and self.linked is not None:
                    self.linked.noted(target, r.status, r.headers)  # a redirect's X-Linked-ETag, for its target
                if r.status >= 500 and not from_origin(r):
                    self.mark_down(peer, f"answered {r.status}")
                    continue
                if body is None and on_manifest is not None and r.status == 200 and CHUNKED_HEADER in r.headers:
                    answered = await on_manifest(request, r, peer)
                    if answered is not None:
                        return answered
                    continue
                if body is None and on_answer is not None:
                    answered = await on_answer(request, r, peer)
                    if answered is not None:
                        return answered
                if body is None and on_head is not None:
                    answered = await on_head(request, r, peer)
                    if answered is not None:
                        taken = True
                        return answered
                if body is None:
                    body = await start_body(self, request, r, peer)
                elif not resumed(body, r, peer, target=target):
                    break
                if request.method == "HEAD":
                    await body.out.write_eof()
                    return body.out
                try:
                    await stream_body(self, request, r, body, peer=peer)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # down, unless its own fill failed
                    await self.broke_off(peer, target, f"broke mid-body after {body.sent} bytes: {type(e).__name__}")
                    continue
                except splice.ClientGone as e:
                    return client_gone(request, body, peer.id, e)
                return await finish_body(self, request, body, target)
            finally:
                if not taken:
                    r.release()
        if body is None:
            return None
        return await unfinished(self, request, body, origin_url=origin_url, target=target, here=here)
