"""Large objects cut into chunks spread over the ring. Pure: no I/O.

An object at least `chunk_threshold` bytes long is stored as fixed-size
chunks (the last one shorter), each its own stored object on the owners of
its own key, so one object's bytes (and its fill from the origin) spread
over the cluster and capacity is counted per chunk. The node that stored
the object's key holds only a manifest (`Manifest`, below; the rooms that
use them are in cachenode/chunks/).

"Chunk" stays apart from a parallel fill's "slices" (cachenode/fill/slices.py):
slices are stretches one node fetches at once, a range request each, into
one file; chunks are objects, each with owners of its own. A "piece"
(`Piece`) is the bytes of one chunk one read needs (docs/architecture.md,
"Glossary").

A chunk's key is the object's key, `#chunk/`, the chunk size and the index.
A cache key never holds `#` (nezha/keys.py drops a target's fragment), so no
URL a client sends can name a chunk, and a chunk of one chunk size is never
taken for a chunk of another.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from nezha.ring import Ring

CHUNK_MARK = "#chunk/"


def chunk_key(key: str, index: int, chunk_size: int) -> str:
    """The key chunk `index` of the object under `key`, cut `chunk_size` long, is stored and owned under."""
    if index < 0 or chunk_size <= 0:
        raise ValueError(f"chunk {index} of size {chunk_size} of {key!r} cannot exist")
    return f"{key}{CHUNK_MARK}{chunk_size}/{index}"


def chunk_of(key: str) -> tuple[str, int, int] | None:
    """(object key, chunk size, index) of a chunk key; None for any other key."""
    base, mark, rest = key.rpartition(CHUNK_MARK)
    if not mark:
        return None
    size, _, index = rest.partition("/")
    if not (size.isdigit() and index.isdigit()) or int(size) <= 0:
        return None
    return base, int(size), int(index)


def chunks_on(threshold: int, size: int | None) -> bool:
    """An object of `size` bytes is chunked: chunking is on (threshold > 0) and it is that large."""
    return threshold > 0 and size is not None and size >= threshold


@dataclass(frozen=True)
class Piece:
    """The piece of one chunk a read needs: bytes [offset, offset + length) of chunk `index`."""

    index: int
    offset: int
    length: int


@dataclass(frozen=True)
class Layout:
    """An object of `size` bytes in chunks of `chunk_size`: chunk i holds
    bytes [i * chunk_size, min((i + 1) * chunk_size, size))."""

    size: int
    chunk_size: int

    def __post_init__(self) -> None:
        if self.size < 0 or self.chunk_size <= 0:
            raise ValueError(f"no layout for {self.size} bytes in chunks of {self.chunk_size}")

    @property
    def count(self) -> int:
        return -(-self.size // self.chunk_size)

    def span(self, index: int) -> tuple[int, int]:
        """(first byte, last byte) of chunk `index`, inclusive, as a Range names them."""
        if not 0 <= index < self.count:
            raise IndexError(f"chunk {index} of an object of {self.count} chunks")
        first = index * self.chunk_size
        return first, min(first + self.chunk_size, self.size) - 1

    def length_of(self, index: int) -> int:
        first, last = self.span(index)
        return last - first + 1

    def pieces(self, start: int, length: int) -> list[Piece]:
        """The chunks bytes [start, start + length) lie in, in order, and the piece of each they need."""
        if length <= 0:
            return []
        if start < 0 or start + length > self.size:
            raise ValueError(f"bytes {start}-{start + length - 1} are outside an object of {self.size} bytes")
        out = []
        end = start + length
        index = start // self.chunk_size
        while index * self.chunk_size < end:
            first = index * self.chunk_size
            lo = max(start, first) - first
            hi = min(end, first + self.chunk_size) - first
            out.append(Piece(index=index, offset=lo, length=hi - lo))
            index += 1
        return out


@dataclass(frozen=True)
class Manifest:
    """What the owner of a chunked object's key holds in place of its bytes,
    and sends a peer in their place (nezha/wire.py CHUNKED_HEADER): the
    object is `length` bytes in chunks of `chunk_size`. One encoder and one
    decoder, so the node that writes it and every node that reads it (a
    reader answering its client, a replica or hand-off copying the manifest)
    agree on its shape."""

    chunk_size: int
    length: int

    def __post_init__(self) -> None:
        if self.chunk_size <= 0 or self.length < 0:
            raise ValueError(f"no manifest for {self.length} bytes in chunks of {self.chunk_size}")

    @property
    def layout(self) -> Layout:
        return Layout(size=self.length, chunk_size=self.chunk_size)

    def encode(self) -> str:
        return json.dumps({"chunk_size": self.chunk_size, "length": self.length})

    @classmethod
    def decode(cls, value: str) -> "Manifest":
        """The manifest `value` (an `encode`d one) names; ValueError naming what is wrong."""
        try:
            raw = json.loads(value)
            return cls(chunk_size=int(raw["chunk_size"]), length=int(raw["length"]))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"manifest {value[:200]!r} is unreadable: {type(e).__name__}: {e}") from e


# How far above an even share one node's chunks of one object may go: the
# ring alone gives one node of four more than 40% of a 32-chunk object for
# about one object in five (tests/unit/nezha/test_chunks.py measures it).
LOAD_SLACK = 1.25


def place(ring: Ring, key: str, layout: Layout, replicas: int, *, slack: float = LOAD_SLACK) -> list[list[str]]:
    """The owners of every chunk of `key`, first owner first: ring(key, chunk),
    with bounded loads (consistent hashing with bounded loads, Mirrokni et
    al. 2016).

    Chunk i takes the first `replicas` nodes on the ring's walk from its own
    chunk key that hold fewer than `ceil(slack * chunks * replicas / nodes)`
    of this object's chunk copies, chunks taken in index order, after its
    first owner: the first node on that walk that leads fewer than
    `ceil(chunks / nodes)` of the object's chunks (all first owners are
    chosen before any other copy). The first owner fills a chunk and starts its copies to every
    other reading node, so its link carries the most: with the bound on
    copies alone, one node of eight led 3 of an 8-chunk object's chunks and
    one of four led 4 (bench/stampede.py's `f`), and every chain behind its
    busy link waited (docs/benchmarks.md, "Chunk stampedes: each hop
    timed"). So no node holds more than that share of one object, nor leads
    more than an even share of its chunks, every node computes the same
    table from the same ring, and a change of members moves about the chunks
    the ring itself moves (plus those the bound pushes on). Raises nothing:
    an empty ring gives no owners.
    """
    walk_all = len(ring.owners(key, 1 << 30))  # every node, once
    if walk_all == 0:
        return [[] for _ in range(layout.count)]
    r = min(replicas, walk_all)
    cap = max(1, math.ceil(slack * layout.count * r / walk_all))
    lead_cap = max(1, math.ceil(layout.count / walk_all))
    walks = [ring.owners(chunk_key(key, index, layout.chunk_size), walk_all) for index in range(layout.count)]
    leads: dict[str, int] = {}
    firsts = []
    for walk in walks:  # the first owners first, every node below its even share of them
        first = next(n for n in walk if leads.get(n, 0) < lead_cap)
        leads[first] = leads.get(first, 0) + 1
        firsts.append(first)
    load = dict(leads)
    table = []
    for first, walk in zip(firsts, walks):  # then the other copies, below the bound on copies
        others = [n for n in walk if n != first]
        chosen = [n for n in others if load.get(n, 0) < cap][:r - 1]
        chosen += [n for n in others if n not in chosen][:r - 1 - len(chosen)]
        for n in chosen:
            load[n] = load.get(n, 0) + 1
        table.append([first, *chosen])
    return table
