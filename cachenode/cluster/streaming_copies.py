"""Streaming copies: in a stampede, the readers of one object on a node share
one stream from its owner, kept here as the node's copy while it arrives
(docs/cache-node.md, "Streaming copies").

A non-owner relays each read of a key to the key's owner, and a hot copy is
made only once the object is stored at the owner and `hot_reads` relayed
reads have ended. In a cold wave (K pods on N nodes starting at once) no
hot copy ever started, and every byte left the owner's link once per pod,
K·S, however many nodes shared the load (docs/benchmarks.md, "Stampede").

So the first relayed read of a key this node holds no copy of leads a
*head* here: plain reads of the key that arrive while its answer's head is
on the way wait for it (`joinable`) instead of relaying on their own. When
the head comes and the owner says it is filling the object now (`miss`,
`miss-joined`), and as many reads as make a key hot (`--hot-reads`,
counting the head; two for the key's second owner) wait on it, the answer becomes this
node's copy (`take`): its body is written here as it streams in from the
owner's fill (the relay already follows a growing fill), the leading read
and every waiting one are served from that growing copy, and reads arriving
until it lands join it. A non-owner's copy is a hot copy (`Meta.hot`,
within the hot share); the key's second owner's is its replica. One request
from each node to the owner, however many of its pods read the object. The
rules are `cluster/streaming.py`'s (pure): a read alone is relayed as
before, and an object stored at the owner already is left to the hot
copy's own count.

If the owner breaks off mid-body (killed), the copy goes on (`_rest`) from
the next owner, else the origin, by Range + If-Range from the byte it had
reached: its readers never see the break, and each node asks for the rest
once, not once per reader. An answer with no validator to pin the rest by
fails instead, and its readers are cut: never a wrong byte.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Mapping, Protocol

import aiohttp
import structlog

from cachenode.cluster.streaming import Head, fanout_for, feeds_from, may_share, streams
from cachenode.cluster_view import ClusterView
from cachenode.counts import Counts
from cachenode.fill.buffer import Fill
from cachenode.fill.flights import Flight, Flights, Kind, Outcome, Source
from cachenode.fill.parallel import Validator, if_range_validator, partial_mismatch
from cachenode.fill.running import FILL_READ
from cachenode.store.disk import Store
from cachenode.store.objects import Meta
from nezha.config import CacheSettings, Origin
from nezha.errors import FillAborted, NezhaError, OriginError
from nezha.keys import Target
from nezha.ring import Peer
from nezha.wire import AUTHORIZE_HEADER, CACHE_HEADER, CHUNKED_HEADER

log = structlog.get_logger("nezha.cachenode")

# `peer_timeout`s a node waits for the copy of the node that feeds it (the
# head read there is deciding on its own answer), and that node waits for it.
PARENT_WAIT = 2
# `peer_timeout`s a feeder asked before any read of its own came waits for
# the first: a stampede's reads arrive together, and one that came a moment
# late would send the node it feeds to the first owner's link for a whole copy.
ARRIVAL_WAIT = 0.5


class LeadAnswered(Protocol):
    """A flight led with the source's answer in hand (`FillEngine.lead`)."""

    async def __call__(self, flight: Flight, *, key: str, url: str, origin: Origin, stale: Meta | None,
                       target: Target, source: Source,
                       answer: aiohttp.ClientResponse | None = None) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        ...


class Owners(Protocol):
    """How the rest of a copy is asked of the other owners (cachenode/front/relay.py `PeerRelay`)."""

    async def ask(self, peer: Peer, method: str, url: str, *, headers: dict[str, str],
                  header_timeout: float | None = None) -> aiohttp.ClientResponse: ...

    def order(self, owners: list[Peer]) -> list[Peer]: ...

    def mark_down(self, peer: Peer, why: str) -> None: ...

    def own_fields(self, target: Target) -> dict[str, str]:
        """The fields that make a request about `target` this node's own, a peer's."""

    async def broke_off(self, peer: Peer, target: Target, why: str) -> None:
        """Marked down unless it says its own fill failed (cachenode/peers/asks.py `PeerAsks.broke_off`)."""


class OriginRequest(Protocol):
    """The origin, asked for the rest when no owner is left (`Upstream.request`)."""

    async def __call__(self, method: str, url: str, *, headers: Mapping[str, str],
                       what: str) -> aiohttp.ClientResponse: ...


@dataclass(frozen=True)
class ManifestAnswer:
    """The head read's owner answered with a chunked object's manifest: the
    reads waiting on it read the chunks with it, without asking again."""

    answer: aiohttp.ClientResponse  # its headers (the manifest, the owner's expiry) are what is read
    peer: Peer


@dataclass
class HeadRead:
    """The leading relayed read of a key here, and the reads waiting on its answer."""

    key: str
    decided: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    waiting: int = 0  # this node's other readers of the key waiting on it
    # Copy requests of nodes this one feeds (`for_peer`) waiting on it: not
    # readers here. One comes only once its node's own head has the owner's
    # answer, before or after this head has it as the machine's load orders
    # them, so it is kept apart from `waiting`.
    peers: int = 0
    taken: bool = False  # its answer became this node's copy, and served it


class StreamingCopies:
    def __init__(self, *, settings: CacheSettings, store: Store, cluster: ClusterView, flights: Flights,
                 lead: LeadAnswered, owners: Owners, origin: OriginRequest, counts: Counts, via: str) -> None:
        self.settings = settings
        self.node_id = settings.identity
        self.store = store
        self.cluster = cluster
        self.flights = flights
        self.lead = lead
        self.owners = owners
        self.origin = origin
        self.counts = counts
        self.via = via
        self._heads: dict[str, HeadRead] = {}
        self._copies: dict[str, Flight] = {}  # the copies streaming in now, by key
        self._arriving: dict[str, asyncio.Event] = {}  # keys a node this one feeds waits for a first read of

    def shares(self, method: str, headers: Mapping[str, str]) -> bool:
        """Whether this read may be answered from another read's stream (hot copies on, a plain GET)."""
        return self.settings.hot_reads > 0 and may_share(method, headers)

    async def joinable(self, key: str, *, wait: float | None = None) -> Flight | ManifestAnswer | None:
        """The copy of `key` streaming in here, if any; else, while another
        read's answer is on the way, that answer's copy once it comes, or the
        manifest it was (None: it was relayed, not copied, or `wait` seconds
        went by first). For a reader of `key` here."""
        return await self._join(key, wait=wait, peer=False)

    async def _join(self, key: str, *, wait: float | None, peer: bool) -> Flight | ManifestAnswer | None:
        """`joinable`, counted on the head as a reader here or as a peer's copy request (`peer`)."""
        flight = self._copies.get(key)
        if flight is not None:
            if self.flights.get(key) is flight:
                return flight
            self._copies.pop(key, None)  # landed: stored, or failed
        head = self._heads.get(key)
        if head is None:
            return None
        if peer:
            head.peers += 1
        else:
            head.waiting += 1
        try:
            async with asyncio.timeout(wait):
                return await asyncio.shield(head.decided)
        except TimeoutError:
            return None
        finally:
            if peer:
                head.peers -= 1
            else:
                head.waiting -= 1

    def head(self, key: str) -> HeadRead | None:
        """Make this read the head of `key` here; None when another read is."""
        if key in self._heads or key in self._copies:
            return None
        head = self._heads[key] = HeadRead(key=key)
        if (arrived := self._arriving.pop(key, None)) is not None:
            arrived.set()
        return head

    def settle(self, head: HeadRead, flight: Flight | ManifestAnswer | None = None) -> None:
        """The head's answer is decided: the waiting reads join `flight` (or read
        the chunks of the manifest it was), or relay on their own."""
        if not head.decided.done():
            head.decided.set_result(flight)
        if self._heads.get(head.key) is head:
            del self._heads[head.key]

    async def take(self, head: HeadRead, answer: aiohttp.ClientResponse, peer: Peer, *, target: Target,
                   url: str, origin: Origin, owners: list[Peer], ahead: list[Peer]) -> Fill | None:
        """The owner `peer`'s answer to the head read: this node's copy, streaming
        in (its fill, which the head read and every waiting one follow), or None
        (it is relayed as before, untouched). Raises FillAborted when the answer
        was taken and no copy came of it (it can no longer be relayed)."""
        replica = len(ahead) < len(owners)
        length = answer.content_length
        facts = Head(status=answer.status, cache=answer.headers.get(CACHE_HEADER, ""), length=length,
                     chunked=CHUNKED_HEADER in answer.headers, varies="Vary" in answer.headers,
                     authorize=origin.credentials == "authorize" or answer.headers.get(AUTHORIZE_HEADER) == "1",
                     waiting=head.waiting, peers=head.peers, replica=replica, hot_reads=self.settings.hot_reads,
                     hot_room=self.settings.hot_capacity,
                     fits=length is not None and self.store.fits(length))
        why = streams(facts)
        if why is not None:
            self.settle(head)
            return None
        sender, fed = await self._feed(head.key, answer, peer, target=target, owners=len(owners))
        flight, leader = self.flights.lead_or_join(head.key)
        if not leader:  # a copy or fill of the key runs here already (a replica's push): relayed as before
            self.settle(head)
            if fed is answer:
                return None
            fed.release()
            raise FillAborted(f"{head.key} began to be fetched here while {sender.id}'s copy was asked for")
        for key, running in list(self._copies.items()):  # those landed since: the map holds copies in flight
            if self.flights.get(key) is not running:
                del self._copies[key]
        self._copies[head.key] = flight
        source = Source(url=sender.url + target.path_qs, what=f"peer {sender.id} ({sender.address})",
                        headers=self.owners.own_fields(target), peer=sender, hot=not replica,
                        rest=self._rest(fed, key=head.key, target=target, url=url, broke=sender,
                                        others=[p for p in ahead if p.id != sender.id]))
        try:
            outcome, passed = await self.lead(flight, key=head.key, url=url, origin=origin, stale=None,
                                              target=target, source=source, answer=fed)
        except BaseException:
            self.settle(head)
            raise
        if outcome.kind is Kind.STREAMING and outcome.fill is not None:
            head.taken = True
            self.settle(head, flight)
            log.info("streaming_copy_started", key=head.key, source=sender.id, bytes=length, waiting=facts.waiting,
                     peers=facts.peers, hot=not replica)
            return outcome.fill
        self.settle(head)
        if passed is answer:
            return None  # not storable after all: relayed as it is
        if passed is not None:
            passed.release()
        raise FillAborted(f"{sender.id}'s answer for {head.key} could not become a copy here: "
                          f"{outcome.error or outcome.kind.value}")

    async def _feed(self, key: str, answer: aiohttp.ClientResponse, peer: Peer, *, target: Target,
                    owners: int) -> tuple[Peer, aiohttp.ClientResponse]:
        """Who sends this node's copy of `key`, and the answer it streams from:
        the copy of a node ahead of this one when the key's order of nodes says
        so (a tree under the owner), else the owner `peer`'s `answer`."""
        parent = self._parent(key, owners=owners)
        if parent is not None and parent.id not in (peer.id, self.node_id):
            theirs = await self._parents_copy(parent, target, like=answer)
            if theirs is not None:
                answer.close()  # its bytes in flight are all it cost the owner
                return parent, theirs
        return peer, answer

    def _parent(self, key: str, *, owners: int) -> Peer | None:
        """The node whose copy this node's copy of `key` streams from (cluster/streaming.py `feeds_from`)."""
        nodes = len(self.cluster.snapshot.nodes)
        order = self.cluster.owners(key, nodes)
        position = next((i for i, p in enumerate(order) if p.id == self.node_id), None)
        if position is None:
            return None
        parent = feeds_from(position, owners=owners, fanout=fanout_for(nodes))
        return None if parent is None else order[parent]

    async def _parents_copy(self, parent: Peer, target: Target, *,
                            like: aiohttp.ClientResponse) -> aiohttp.ClientResponse | None:
        """`parent`'s copy streaming in, as an answer to read this node's copy
        from: the same version (strong ETag) and length as the owner's answer
        `like`; None when it has none (its reads did not make one) or does not answer."""
        etag = like.headers.get("ETag")
        if etag is None or etag.startswith("W/"):
            return None
        fields = {**self.owners.own_fields(target), "Cache-Control": "only-if-cached"}
        try:
            r = await self.owners.ask(parent, "GET", parent.url + target.path_qs, headers=fields,
                                      header_timeout=PARENT_WAIT * self.settings.peer_timeout)
        except NezhaError as e:
            log.info("streaming_parent_missed", key=target.path, parent=parent.id, reason=str(e))
            return None
        if (r.status == 200 and r.content_length == like.content_length and r.headers.get("ETag") == etag
                and CHUNKED_HEADER not in r.headers):
            return r
        log.info("streaming_parent_missed", key=target.path, parent=parent.id, reason=f"answered {r.status}")
        r.release()
        return None

    async def for_peer(self, key: str) -> Flight | None:
        """The copy of `key` streaming in here for a node this one feeds (its
        `only-if-cached` request): the copy, or the one this node's head read
        is about to make, waited for a bounded time; asked before any read
        of the key came here, the one the first read to come makes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PARENT_WAIT * self.settings.peer_timeout
        if key not in self._heads and key not in self._copies and not await self._arrival(key):
            return None
        found = await self._join(key, wait=max(0.0, deadline - loop.time()), peer=True)
        return found if isinstance(found, Flight) else None

    async def _arrival(self, key: str) -> bool:
        """Whether a read of `key` comes here (a head) within ARRIVAL_WAIT."""
        arrived = self._arriving.setdefault(key, asyncio.Event())
        try:
            async with asyncio.timeout(ARRIVAL_WAIT * self.settings.peer_timeout):
                await arrived.wait()
            return True
        except TimeoutError:
            if self._arriving.get(key) is arrived:
                del self._arriving[key]
            return False

    def _rest(self, answer: aiohttp.ClientResponse, *, key: str, target: Target, url: str, broke: Peer,
              others: list[Peer]) -> Callable[[int, BaseException], AsyncIterator[bytes]] | None:
        """How the copy goes on when `broke` breaks off mid-body: the rest of
        the same version from the owners `others` in order, else the origin,
        pinned by If-Range. None without a validator to pin it by."""
        length = answer.content_length
        validator = if_range_validator(answer.headers)
        if length is None or validator is None:
            return None
        if validator.etag is not None:
            # A strong ETag alone ties the rest to the head (If-Range sends it; a 206 carries it).
            validator = dataclasses.replace(validator, last_modified=None)

        async def rest(offset: int, error: BaseException) -> AsyncIterator[bytes]:
            if offset >= length:
                return
            # Down, unless it cut the copy because its own fill failed (its origin died mid-body).
            await self.owners.broke_off(broke, target,
                                        f"broke off a streaming copy after {offset} bytes: {type(error).__name__}")
            log.warning("streaming_copy_resumed", key=key, source=broke.id, offset=offset,
                        error=f"{type(error).__name__}: {error}")
            for peer in self.owners.order(others):
                try:
                    async for data in self._range(peer, target, validator, offset, length):
                        offset += len(data)
                        yield data
                except OriginError:  # not had: `ask` marked it down when its liveness probe failed too
                    continue
                except (NezhaError, aiohttp.ClientError, asyncio.TimeoutError) as e:
                    # Asked, as `broke` was: a live peer whose own fill failed stays up.
                    await self.owners.broke_off(peer, target, f"broke off a streaming copy's rest after {offset} "
                                                              f"bytes: {type(e).__name__}")
                    continue
                if offset >= length:
                    return
            async for data in self._range(None, target, validator, offset, length, url=url):
                self.counts.count(target.host, bytes_from_origin=len(data))
                yield data

        return rest

    async def _range(self, peer: Peer | None, target: Target, validator: Validator, offset: int, length: int, *,
                     url: str = "") -> AsyncIterator[bytes]:
        """Bytes [offset, length) of the copy's version from `peer` (None: the origin at `url`)."""
        pinned = {"Range": f"bytes={offset}-{length - 1}", "If-Range": validator.if_range}
        if peer is not None:
            where = f"peer {peer.id}"
            r = await self.owners.ask(peer, "GET", peer.url + target.path_qs,
                                      headers={**self.owners.own_fields(target), **pinned})
        else:
            where = f"origin {url}"
            r = await self.origin("GET", url, headers={**pinned, "Via": self.via}, what=where)
        try:
            why = partial_mismatch(r.status, r.headers, first=offset, last=length - 1, total=length,
                                   validator=validator)
            if why is not None:
                raise FillAborted(f"{where} for the rest of a streaming copy (bytes {offset}-{length - 1}): {why}")
            async for data in r.content.iter_chunked(FILL_READ):
                yield data
        finally:
            r.release()
