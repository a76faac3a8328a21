"""Talking to one peer: how long its connect may take, whether it is down, and
asking it with a liveness probe in place of a long timeout.

These are the rules a relay (front/relay.py), a chunk read (chunks/peers.py)
and a fill led through a peer (fill/running.py) share, kept apart from the
relay's loop over owners so each can be read alone, in a room below all
three (cachenode/peers/): what they call of it goes down the layers.

- **One failed attempt is not a verdict.** A connect that fails or is
  refused, or a connection dropped before the headers, is followed by a
  liveness probe (`ask`): an owner that fails it too is marked down for a
  few seconds (tried last, not skipped); one that answers it is alive (a
  SYN lost on a loaded box) and is asked once more. A request or probe
  that found this node's own client pool full (`PoolBusy`) asked the peer
  nothing and is no verdict. An owner's own 5xx marks it down at once:
  that is its answer, not silence.
- **The connect budget.** An owner that answered within the last
  `ANSWERED_WITHIN` seconds is given `RECENT_CONNECT` times `peer_timeout`
  to connect (and to be probed): on a saturated link a new connection's SYN
  is dropped and sent again a second later, and a stampede marked busy
  owners down for it and read their chunks from the origin
  (docs/benchmarks.md, "Stampede").
- **Silence is probed, not waited out.** A cold owner may legitimately wait
  for the origin before it sends its headers, a frozen one never will; after
  each `peer_timeout` of silence the owner's `/healthz` tells the two apart
  (`ask` before the headers, `guard` mid-body).
- **A body that breaks is asked why** (`broke_off`): an owner whose own
  fill failed says so and is not marked down (peers/cuts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import TYPE_CHECKING, Callable

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from nezha.ring import Peer
from nezha.keys import Target
from cachenode.http.headers import end_to_end_pairs
from cachenode.peers.auth import peer_auth
from cachenode.peers.cuts import asked_why_cut
from nezha.errors import OriginError, OriginTimeout, PoolBusy
from nezha.wire import (CACHE_HEADER, CHUNK_HEADER, CUT_HEADER, DIGEST_HEADER, ORIGIN_ERROR_HEADER, PASSED_ON,
                        PEER_HEADER, SCHEME_HEADER, TOKEN_HEADER)

if TYPE_CHECKING:
    from prometheus_client import Counter

    # The client is handed over (cachenode/node.py): a type, no dependency on the fill's room above.
    from cachenode.fill.origin import Interim, OriginClient
    from cachenode.fill.verify import Digests

log = structlog.get_logger("nezha.peers")

# An owner heard from this many seconds ago is taken to be alive, its link busy...
ANSWERED_WITHIN = 30.0
# ...and is given this many `peer_timeout`s to connect: a SYN dropped by a full
# link is sent again after 1 s, then 2 s later (Linux's initial RTO), both within
# 4 s at the default `peer_timeout` of 1 s.
RECENT_CONNECT = 4


class PeerSilent(OriginTimeout):
    """A peer took the connection but stopped answering, and failed its liveness probe."""


class PeerLate(OriginTimeout):
    """A peer kept passing its liveness probes but sent no headers within `header_timeout`: alive, not down."""


# Asked once more when the first attempt failed but the peer passed its probe: nothing changes on the peer.
SAFE_AGAIN = frozenset({"GET", "HEAD"})


def from_origin(response: aiohttp.ClientResponse) -> bool:
    """Whether an owner's 5xx is the origin's failure passed on, not the owner's own."""
    return ORIGIN_ERROR_HEADER in response.headers or response.headers.get(CACHE_HEADER) in PASSED_ON


class PeerAsks:
    """One node's asks of its peers: their down marks and connect budgets, and
    the asks, probes and body guards that use them. The relay (`PeerRelay`)
    is one; chunk reads and fills led through a peer ask through it too."""

    def __init__(self, *, node_id: str, client: OriginClient, peer_timeout: float, read_timeout: float,
                 header_timeout: float, read_size: int, down_for: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, use_splice: bool = True,
                 cluster_token: str | None = None, mismatches: "Counter | None" = None,
                 linked: Digests | None = None) -> None:
        """`peer_timeout` bounds the connect, each silence before a probe, and the probe.

        `header_timeout` bounds the wait for the headers of an owner that
        keeps passing its probe (a cold owner waiting for the origin);
        `read_timeout` bounds silence mid-body from such an owner.
        `mismatches`: nezha_digest_mismatches_total{origin}, which a relayed
        body that fails its digest check counts as a fill's does.
        """
        self.mismatches = mismatches
        self.node_id = node_id
        self.cluster_token = cluster_token
        self.client = client
        self.peer_timeout = peer_timeout
        self.header_timeout = header_timeout
        self.read_timeout = read_timeout
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=peer_timeout, sock_read=read_timeout)
        self.read_size = read_size
        self.down_for = down_for
        self._clock = clock
        self._down_until: dict[str, float] = {}
        self._answered_at: dict[str, float] = {}  # when each peer last answered (its headers, or a probe)
        self._stalled: dict[str, float] = {}  # when `guard` last cut each peer off: it failed its probe mid-body
        # Hugging Face's digests of redirect targets (fill/verify.py `Digests`): noted
        # as the relay passes redirects on, handed to a target's owner when relaying it.
        self.linked = linked
        self.splice = use_splice

    def mark_down(self, peer: Peer, why: str) -> None:
        self._down_until[peer.id] = self._clock() + self.down_for
        self._answered_at.pop(peer.id, None)  # its next connect is given `peer_timeout` again
        log.warning("peer_marked_down", peer=peer.id, address=peer.address, reason=why, seconds=self.down_for)

    async def broke_off(self, peer: Peer, target: Target, why: str) -> None:
        """`peer`'s answer for `target` broke off mid-body (`why`): marked down
        unless it says it cut the answer because its own fill failed (its
        origin died mid-body: peers/cuts.py). One `guard` cut off for failing
        its liveness probe within `down_for` seconds is not asked: it would
        only fail the question's probe too, seconds later."""
        stalled = self._stalled.get(peer.id)
        if stalled is not None and self._clock() - stalled < self.down_for:
            self.mark_down(peer, f"{why}; it failed its liveness probe")
            return
        failed = await asked_why_cut(self, peer, peer.url + target.path_qs, headers=self.own_fields(target), why=why)
        if failed is not None:
            log.info("peer_fill_failed", peer=peer.id, path=target.path, reason=failed, broke=why)

    def connect_budget(self, peer: Peer) -> float:
        """How long a connect to `peer` may take: `peer_timeout`, or
        RECENT_CONNECT times it for a peer that answered within ANSWERED_WITHIN seconds."""
        heard = self._answered_at.get(peer.id)
        if heard is not None and self._clock() - heard < ANSWERED_WITHIN:
            return self.peer_timeout * RECENT_CONNECT
        return self.peer_timeout

    def is_down(self, peer: Peer) -> bool:
        return self._down_until.get(peer.id, 0.0) > self._clock()

    def order(self, owners: list[Peer]) -> list[Peer]:
        """Owners in ring order, those recently failed last (still tried: they may be back)."""
        return [p for p in owners if not self.is_down(p)] + [p for p in owners if self.is_down(p)]

    def own_fields(self, target: Target) -> dict[str, str]:
        """The fields of this node's own request to a peer about `target`: none of a client's."""
        return {"Host": target.host, PEER_HEADER: self.node_id, SCHEME_HEADER: target.scheme,
                **peer_auth(self.cluster_token)}

    def peer_headers(self, request: web.Request, target: Target) -> dict[str, str]:
        headers = CIMultiDict(end_to_end_pairs(request.headers))  # fill/origin.py's `end_to_end`, sent on
        headers["Host"] = target.host
        headers.popall(TOKEN_HEADER, None)  # a client's, if it sent one: never forwarded
        # A client's chunk request would become this node's, made with its token:
        # only a node reading a chunked object asks for a chunk (cachenode/chunks/reads.py).
        headers.popall(CHUNK_HEADER, None)
        # A client's digest would be believed as this node's: a wrong one would make the owner refuse right bytes.
        headers.popall(DIGEST_HEADER, None)
        # A client's question of why a cut happened would be answered in place of its object (peers/cuts.py).
        headers.popall(CUT_HEADER, None)
        headers[PEER_HEADER] = self.node_id
        headers[SCHEME_HEADER] = target.scheme
        headers.update(peer_auth(self.cluster_token))
        return headers

    async def probe(self, peer: Peer) -> str | None:
        """None when `peer` answers `/healthz` within `peer_timeout` (its connect
        within `connect_budget`), else why it did not. None too when no
        connection of this node's own pool came free to ask with (a stampede
        here): that is no verdict on the peer."""
        budget = self.connect_budget(peer)
        timeout = aiohttp.ClientTimeout(total=self.peer_timeout) if budget == self.peer_timeout else \
            aiohttp.ClientTimeout(total=None, sock_connect=budget, sock_read=self.peer_timeout)
        try:
            r = await self.client.request("GET", peer.url + "/healthz", headers={}, what=f"peer {peer.id} /healthz",
                                          timeout=timeout)
        except PoolBusy as e:
            log.info("peer_probe_pool_busy", peer=peer.id, address=peer.address, error=str(e))
            return None
        except OriginTimeout:
            return f"it did not answer /healthz within {self.peer_timeout:g}s"
        except OriginError as e:
            return f"its liveness probe failed: {e}"
        try:
            if r.status != 200:
                return f"its /healthz answered {r.status}"
            self._answered_at[peer.id] = self._clock()
            return None
        finally:
            r.release()

    async def ask(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                  header_timeout: float | None = None, interim: Interim | None = None,
                  after: str | None = None) -> aiohttp.ClientResponse:
        """`peer`'s response, once its headers are in; `interim` hears its 1xx
        answers (the origin's, passed on by the owner) before it. `after`:
        what led to asking, said first in the reason `peer` is marked down.

        Raises OriginError when it could not be had, having marked `peer`
        down only if a liveness probe confirmed it: PeerSilent when it went
        silent and failed the probe then; any other failure (a refused,
        dropped or timed-out connect, a connection closed before the
        headers) is probed afterwards. A peer that passes that probe is alive
        and a GET or HEAD is asked once more; raised again, it stays up (the
        caller moves on for this request alone). PeerLate: it kept passing
        probes but sent nothing within `header_timeout`, not down either;
        PoolBusy: no connection of this node's own pool came free, so it was
        never asked, nor probed.
        """
        again = method in SAFE_AGAIN
        while True:
            try:
                return await self._ask_once(peer, method, url, headers=headers, header_timeout=header_timeout,
                                            interim=interim)
            except PeerSilent as e:
                self.mark_down(peer, str(e) if after is None else f"{after}; then did not answer: {e}")
                raise
            except (PeerLate, PoolBusy):  # alive by its probes; or never asked: this node's pool was full
                raise
            except OriginError as e:
                why = await self.probe(peer)
                if why is not None:
                    self.mark_down(peer, f"{e}; then {why}" if after is None else
                                   f"{after}; then did not answer: {e}; then {why}")
                    raise
                log.info("peer_failed_probe_passed", peer=peer.id, address=peer.address, error=str(e),
                         again=again)
                if not again:
                    raise
                again = False

    async def _ask_once(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                        header_timeout: float | None, interim: Interim | None) -> aiohttp.ClientResponse:
        """One attempt of `ask`: PeerSilent, PeerLate, or the client's OriginError as it came."""
        loop = asyncio.get_running_loop()
        budget = self.header_timeout if header_timeout is None else header_timeout
        what = f"peer {peer.id} ({peer.address})"
        connect = self.connect_budget(peer)
        timeout = self.timeout if connect == self.peer_timeout else \
            aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=self.read_timeout)
        task = loop.create_task(self.client.request(method, url, headers=headers, what=what, timeout=timeout,
                                                    interim=interim))
        started = loop.time()
        response: aiohttp.ClientResponse | None = None
        try:
            while True:
                await asyncio.wait({task}, timeout=self.peer_timeout)
                if task.done():
                    response = task.result()
                    return response
                waited = loop.time() - started
                if waited >= budget:
                    raise PeerLate(f"{what}: no response headers within {budget:g}s")
                why = await self.probe(peer)
                if task.done():
                    response = task.result()
                    return response
                if why is not None:
                    raise PeerSilent(f"{what}: no response headers after {waited:.1f}s, and {why}")
        finally:
            if response is not None:
                self._answered_at[peer.id] = self._clock()
            if not task.done():
                task.cancel()
                for result in await asyncio.gather(task, return_exceptions=True):
                    if isinstance(result, aiohttp.ClientResponse):
                        result.release()
            elif response is None and not task.cancelled() and task.exception() is None:
                task.result().release()

    def guard(self, peer: Peer, response: aiohttp.ClientResponse, progress: Callable[[], int]) -> asyncio.Task:
        """Watch a body from `peer`: when `progress()` stands still for `peer_timeout`
        and `peer` then fails a probe, cut the connection so the reader fails
        now (and can resume elsewhere) rather than after `read_timeout`, and
        note it (`broke_off` then asks it nothing).

        A client that reads slowly, or an owner waiting on a slow origin,
        stands still too; they pass the probe and are left alone.
        """
        conn = response.connection
        sock = conn.transport.get_extra_info("socket") if conn is not None and conn.transport is not None else None

        async def watch() -> None:
            loop = asyncio.get_running_loop()
            last, moved_at = progress(), loop.time()
            while True:
                await asyncio.sleep(self.peer_timeout / 4)
                if progress() != last:
                    last, moved_at = progress(), loop.time()
                    continue
                if loop.time() - moved_at < self.peer_timeout:
                    continue
                why = await self.probe(peer)
                if why is None or progress() != last:
                    last, moved_at = progress(), loop.time()
                    continue
                log.warning("peer_stalled", peer=peer.id, address=peer.address, reason=why, at=last)
                if sock is not None:
                    # Shutdown reaches every descriptor of the socket, the
                    # splice's duplicate included; closing the transport would not.
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                self._stalled[peer.id] = self._clock()
                response.close()
                return

        return asyncio.get_running_loop().create_task(watch())
