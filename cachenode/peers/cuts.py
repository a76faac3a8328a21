"""Why a peer cut its answer mid-body: its own fill failed, or it is gone.

A node that streams an object, or a chunk, to a peer while its own fill of
it runs cuts that answer when the fill fails (its origin died mid-body, or
sent bytes that failed their digest). The peer sees what it would see of a
node that died: a body that stops short. Marking a live node down for it
routes every key it owns around it for a few seconds (extra origin
fetches, ring churn, alerts), so each side keeps one half of a contract:

- the node that cut notes why, per key, for CUT_NOTED seconds (`Cuts`), and
  answers the question below from those notes (`answer_cut`);
- the node whose answer broke off asks at once, with the same URL and
  CUT_HEADER (`asked_why_cut`): 200 with FILL_FAILED_HEADER means the node is
  alive and only its fill failed; anything else (404: no cut noted; no
  answer at all: killed, refused, reset, silent) marks it down as before.

Whole objects (the owner's side in front/respond.py and front/handler.py;
the asker's in peers/asks.py `PeerAsks.broke_off`, for front/relay.py and
cluster/streaming_copies.py) and chunks (chunks/owner.py, chunks/peers.py)
share it; what the asker does next (resume from the next owner, else the
origin, else cut its client) is its own and the same either way.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import aiohttp
from aiohttp import web

from nezha.errors import OriginError
from nezha.ring import Peer
from nezha.wire import CUT_HEADER, FILL_FAILED_HEADER, origin_error_value

# How long a cut is remembered (`Cuts`): the peer asks why at once, one round trip after the cut.
CUT_NOTED = 10.0


class Cuts:
    """The answers this node cut mid-body because its own fill failed, and
    why, each for CUT_NOTED seconds, by key (a cache key, or a chunk's key)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cut: dict[str, tuple[float, str]] = {}  # key -> (when, why)

    def note(self, key: str, why: str) -> None:
        now = self._clock()
        for old in [k for k, (at, _) in self._cut.items() if now - at > CUT_NOTED]:
            del self._cut[old]
        self._cut[key] = (now, why)

    def why(self, key: str) -> str | None:
        """Why this node cut its answer for `key` within CUT_NOTED seconds; None: it did not."""
        noted = self._cut.get(key)
        return noted[1] if noted is not None and self._clock() - noted[0] <= CUT_NOTED else None


def answer_cut(cuts: Cuts, key: str) -> web.Response:
    """The answer to a peer's question (CUT_HEADER): did this node cut its answer for `key` because its fill failed?"""
    why = cuts.why(key)
    if why is None:
        return web.Response(status=404, text=f"no answer for {key} was cut here for a failed fill\n")
    return web.Response(status=200, headers={FILL_FAILED_HEADER: origin_error_value(why)},
                        text=f"the fill of {key} here failed: {why}\n")


class Asker(Protocol):
    """How the question is asked, and a peer marked down (peers/asks.py `PeerAsks`)."""

    async def ask(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                  after: str | None = None) -> aiohttp.ClientResponse:
        """`peer`'s response; OriginError when it could not be had, `peer`
        marked down (its reason `after` and why) if its liveness probe failed too."""

    def mark_down(self, peer: Peer, why: str) -> None: ...

    def is_down(self, peer: Peer) -> bool: ...


async def asked_why_cut(asker: Asker, peer: Peer, url: str, *, headers: dict[str, str], why: str) -> str | None:
    """`peer`'s answer for `url` broke off mid-body (`why`): asked whether it
    cut it because its own fill failed. That reason, or None when `peer` was
    marked down: it did not answer, or knows of no such cut. `headers`: the
    peer fields of the question (and CHUNK_HEADER, for a chunk)."""
    try:
        r = await asker.ask(peer, "GET", url, headers={**headers, CUT_HEADER: "1"}, after=why)
    except OriginError as e:
        if not asker.is_down(peer):  # else `ask` marked it, with `why`: its liveness probe failed too
            asker.mark_down(peer, f"{why}; then did not answer: {e}")
        return None
    failed = r.headers.get(FILL_FAILED_HEADER) if r.status == 200 else None
    r.release()
    if failed is None:
        asker.mark_down(peer, why)
    return failed
