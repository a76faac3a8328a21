"""Where the bytes of one piece of a chunked read come from, and a chunk read as it is written.

A piece (nezha/chunks.py `Piece`) is opened on one source (`Opened`): a
peer's or the origin's answer, a chunk file of this node's store, or a
chunk this node is filling now (`Growing`), read through a descriptor of
its own (`Tail`) by sendfile as the fill writes it (`send_tail`).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import IO, Protocol

import aiohttp
from aiohttp import web

from cachenode.chunks.peers_first import Paced
from cachenode.fill.pace import Pace
from cachenode.fill.parallel import Validator
from cachenode.store.objects import Meta, TempObject
from nezha.chunks import Piece
from nezha.ring import Peer


class SendFile(Protocol):
    """Bytes [offset, offset + count) of a file to a client, by sendfile where
    it can (cachenode/front/respond.py `Responder.send_file`); ClientGone when
    the client hung up."""

    async def __call__(self, request: web.Request, resp: web.StreamResponse, f: IO[bytes], offset: int,
                       count: int) -> None: ...


@dataclass
class Growing:
    """A chunk being written to this node's disk: a peer asking for it reads
    the temp file as it grows (`temp.written`), woken by `moved`, instead of
    waiting for the whole chunk."""

    temp: TempObject
    validator: Validator
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False
    peer: Peer | None = None  # the owner it comes from, for a chunk passed on (chunks/fills.py `passing`)
    # The owners behind this one copying it as it grows: an origin fill keeps within a window of them
    # (chunks/landing.py `Landing.take`), so a killed first owner takes few bytes they lack with it.
    pace: Pace = field(default_factory=Pace)


class Tail:
    """One reader of a chunk being written here (`Growing`): its own
    descriptor of the temp file, taken at once, for the fill closes its own
    when it ends and the file's name changes (commit) or goes (failure)."""

    def __init__(self, growing: Growing) -> None:
        self.growing = growing
        self.file = os.fdopen(os.dup(growing.temp.read_fd), "rb")

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "Tail":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Opened:
    """One piece of the read, its source already asked: a peer's or the
    origin's answer (`response`), or a file of this node's store (`meta`)."""

    def __init__(self, piece: Piece, *, response: aiohttp.ClientResponse | None = None,
                 meta: Meta | None = None, growing: Tail | None = None, source: str,
                 peer: Peer | None = None, passed: bool = False) -> None:
        self.piece = piece
        self.response = response
        self.meta = meta
        self.growing = growing  # a chunk this node is filling now, read as it grows
        self.source = source
        self.peer = peer  # the owner answering, when it is a peer
        self.passed = passed  # `growing` is a chunk passed on from its owners, not filled here

    def close(self) -> None:
        if self.response is not None:
            self.response.release()
        if self.growing is not None:
            self.growing.close()


async def send_tail(send_file: SendFile, request: web.Request, resp: web.StreamResponse, tail: Tail, start: int,
                    count: int, paced: Paced, copy: Paced | None = None) -> int:
    """Write bytes [start, start + count) of a chunk being filled here to
    `resp` as the fill writes them (by sendfile from its temp file, as a
    joiner of a whole object's fill is sent its bytes), as fast as `paced`
    lets them go (chunks/peers_first.py); how many went: fewer than `count`
    when the fill ended first, having failed. `copy`: an owner behind this
    one copying the chunk, whose place the fill keeps within a window of."""
    growing, sent = tail.growing, 0
    while sent < count:
        at = start + sent
        ready = min(growing.temp.written - at, count - sent)
        if ready <= 0:
            if growing.ended:
                break  # the fill failed (or was cut) before these bytes
            growing.moved.clear()
            await growing.moved.wait()
            continue
        ready = await paced.upto(at, at + ready) - at
        await send_file(request, resp, tail.file, at, ready)
        sent += ready
        paced.sent(start + sent)
        if copy is not None:
            copy.sent(start + sent)
    return sent


async def send_held(send_file: SendFile, request: web.Request, resp: web.StreamResponse, f: IO[bytes], start: int,
                    count: int, paced: Paced) -> None:
    """Write bytes [start, start + count) of a chunk stored here, as fast as `paced` lets them go."""
    at, end = start, start + count
    while at < end:
        upto = await paced.upto(at, end)
        await send_file(request, resp, f, at, upto - at)
        at = upto
        paced.sent(at)
