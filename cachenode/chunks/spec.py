"""What nodes say to each other about one chunk, and the version every chunk of an object is of.

A peer's request for a chunk names it in CHUNK_HEADER (`ChunkSpec`): which
chunk of an object how long, cut how, of which version, and, for a chunk
handed off by a node leaving the ring, who holds it now. Every chunk of one
object is fetched and checked under the manifest's validator
(`manifest_validator`), so a reader never mixes two versions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cachenode.chunks.feeders import ROLES
from cachenode.fill.parallel import Validator
from cachenode.store.objects import Meta
from nezha.chunks import Layout
from nezha.config import parse_hostport
from nezha.errors import FillAborted, NezhaError
from nezha.ring import Peer
from nezha.wire import CHUNK_HEADER

# A stored chunk is never judged by freshness: it is one version's bytes,
# checked against the manifest's validator on every read. This only dates it.
CHUNK_LIFETIME = 365 * 24 * 3600.0


class ChunkChanged(FillAborted):
    """The origin's answer for a chunk is not of the manifest's version: the object changed."""


class ChunkUnavailable(NezhaError):
    """No owner of a chunk, nor the origin, could send it."""


@dataclass(frozen=True)
class ChunkSpec:
    """What a peer's chunk request names (CHUNK_HEADER): chunk `index` of an
    object of `length` bytes cut `chunk_size` long, of the version `validator` names."""

    index: int
    chunk_size: int
    length: int
    validator: Validator
    # A node that holds the chunk but is no longer in the ring (one handing
    # its chunks off on scale-down): asked first when the chunk is filled.
    source: Peer | None = None
    # Why the asker wants the chunk, when it reads it whole in one flight (chunks/feeders.py ROLES):
    # a node passing it on may be sent to another node reading it now. None: a reader's own request.
    role: str | None = None

    def header(self) -> str:
        spec: dict = {"index": self.index, "chunk_size": self.chunk_size, "length": self.length,
                      "etag": self.validator.etag, "last_modified": self.validator.last_modified}
        if self.source is not None:
            spec["from"] = {"id": self.source.id, "address": self.source.address}
        if self.role is not None:
            spec["role"] = self.role
        return json.dumps(spec)

    @classmethod
    def parse(cls, value: str) -> "ChunkSpec":
        """Raises ValueError naming what is wrong."""
        try:
            raw = json.loads(value)
            index, chunk_size, length = int(raw["index"]), int(raw["chunk_size"]), int(raw["length"])
            etag, last_modified, role = raw.get("etag"), raw.get("last_modified"), raw.get("role")
            source = None
            if "from" in raw:
                address = str(raw["from"]["address"])
                parse_hostport(address, field="from")
                source = Peer(str(raw["from"]["id"]), address)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{CHUNK_HEADER} {value[:200]!r} is not a chunk request: {e}") from e
        if role is not None and role not in ROLES:
            raise ValueError(f"{CHUNK_HEADER} names role {role!r}, none of {', '.join(ROLES)}")
        if etag is None and last_modified is None:
            raise ValueError(f"{CHUNK_HEADER} names no validator: a chunk is only ever of one version")
        layout = Layout(size=length, chunk_size=chunk_size)  # ValueError for nonsense sizes
        if not 0 <= index < layout.count:
            raise ValueError(f"chunk {index} of an object of {layout.count} chunks")
        return cls(index=index, chunk_size=chunk_size, length=length,
                   validator=Validator(etag=etag, last_modified=last_modified), source=source, role=role)

    @property
    def layout(self) -> Layout:
        return Layout(size=self.length, chunk_size=self.chunk_size)


def manifest_validator(meta: Meta) -> Validator:
    """The validator every chunk of `meta`'s object is fetched and checked
    under: its strong ETag alone when it has one (If-Range sends it; a 206
    carries it), else its Last-Modified (fill/parallel.py if_range_validator)."""
    etag = meta.etag if meta.etag is not None and not meta.etag.startswith("W/") else None
    return Validator(etag=etag, last_modified=None if etag is not None else meta.last_modified)
