"""The messages a node's processes send each other, typed, with one encoder and
one decoder (docs/cache-node.md, "Workers"). Pure: json and struct only, so
the supervisor, which imports nothing it does not need, shares them.

A record on a link (cachenode/workers/channel.py) is four bytes of head
length, the head, then raw bytes (the tail: a handed connection's bytes
read so far). The head is a message as JSON: its tag under "t", then its
fields by name. Descriptors travel beside the record, not in it.

Who sends what:

    supervisor -> primary   Follower (with the follower's end of a new link)
    primary -> supervisor   Ready (a worker serves: the primary, or a follower it relays)
    primary -> follower     Rows, Put, Drop (the index, in order), Synced (all of it sent), Flush,
                            Back (with a connection the follower handed over, given back), Granted
    follower -> primary     Conn (with the connection), More (its further bytes), Hits, TlsOutcome,
                            Fallback, Flushed, Ready, Lead, LeadDone, Missed

A record of a tag this version does not know decodes as Unknown, which
each receiver logs (`worker_record_unknown`); a record that is not one at
all raises ValueError (`worker_record_malformed`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, fields
from typing import ClassVar, Union

_LEN = struct.Struct("!I")


@dataclass(frozen=True)
class Follower:
    """A follower started: the descriptor with this is its link, for the primary to serve."""
    TAG: ClassVar[str] = "follower"
    worker: int


@dataclass(frozen=True)
class Ready:
    """A worker serves. From a follower to its primary without `worker` (the link says
    which); from the primary to the supervisor with it, its own (0) or a follower's."""
    TAG: ClassVar[str] = "ready"
    worker: int | None = None


@dataclass(frozen=True)
class Rows:
    """`n` rows of the store's index as they are now, packed in the tail
    (cachenode/store/rows.py `Rows.pack`): objects whose record the follower
    reads from their files, as the primary does."""
    TAG: ClassVar[str] = "rows"
    n: int


@dataclass(frozen=True)
class Put:
    """Objects the store now holds (`Meta`s as dicts: cachenode/workers/primary.py)."""
    TAG: ClassVar[str] = "put"
    metas: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Drop:
    """Objects the store no longer holds, or holds too large to describe: hand their reads over."""
    TAG: ClassVar[str] = "drop"
    metas: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Synced:
    """The whole index was sent: the follower may listen."""
    TAG: ClassVar[str] = "synced"


@dataclass(frozen=True)
class Flush:
    """Send every hit answered so far, then Flushed with the same `n` (before /metrics answers)."""
    TAG: ClassVar[str] = "flush"
    n: int


@dataclass(frozen=True)
class Flushed:
    TAG: ClassVar[str] = "flushed"
    n: int


@dataclass(frozen=True)
class Conn:
    """A client connection handed to the primary (its descriptor with this record, the
    bytes read of it in the tail), followed by `more` More records of further bytes;
    `eof`: the client had closed its side; `secure`: it came over TLS, bridged."""
    TAG: ClassVar[str] = "conn"
    eof: bool = False
    more: int = 0
    secure: bool = False


@dataclass(frozen=True)
class Back:
    """A plain connection a follower handed to the primary, given back to it (its
    descriptor with this record) at a clean request boundary: nothing read of it
    is unanswered, nothing written is still queued."""
    TAG: ClassVar[str] = "back"


@dataclass(frozen=True)
class More:
    """More bytes (the tail) of the connection handed last."""
    TAG: ClassVar[str] = "more"


@dataclass(frozen=True)
class Hits:
    """Hits a follower answered, for the primary to count: each [host, key, slot, hot,
    bytes sent, seconds to first byte or None], a list to keep the record small."""
    TAG: ClassVar[str] = "hits"
    hits: list[list] = field(default_factory=list)


@dataclass(frozen=True)
class TlsOutcome:
    """How a TLS connection on a follower's port ended (the TLS port's outcome label)."""
    TAG: ClassVar[str] = "tls"
    outcome: str


@dataclass(frozen=True)
class Fallback:
    """A follower's TLS port went to the origin because the parent failed (why)."""
    TAG: ClassVar[str] = "fallback"
    reason: str


@dataclass(frozen=True)
class Lead:
    """May this follower lead the fill of `key` (a plain cold miss of `host` `path`)?
    Answered by Granted with the same `n` (cachenode/workers/lead_desk.py)."""
    TAG: ClassVar[str] = "lead"
    n: int
    key: str
    host: str
    path: str


@dataclass(frozen=True)
class Granted:
    """The primary's answer to the Lead numbered `n`."""
    TAG: ClassVar[str] = "granted"
    n: int
    ok: bool


@dataclass(frozen=True)
class LeadDone:
    """How a follower's lead of `key` ended: `meta`, the object whose sealed file it
    wrote, for the primary to admit; None: declined (the primary leads it itself;
    `large`: for what the answer is, not for a failure).
    `seconds`: the fill's time from the origin's answer on, as a fill's duration."""
    TAG: ClassVar[str] = "done"
    key: str
    meta: dict | None = None
    seconds: float = 0.0
    large: bool = False  # declined for what the answer is (not a small object): counts against its origin


@dataclass(frozen=True)
class Missed:
    """Misses a follower answered from its own leads, for the primary to count: each
    [host, bytes sent, seconds to first byte or None], as Hits."""
    TAG: ClassVar[str] = "missed"
    misses: list[list] = field(default_factory=list)


@dataclass(frozen=True)
class Unknown:
    """A record of a tag this version does not know."""
    tag: str


Message = Union[Follower, Ready, Rows, Put, Drop, Synced, Flush, Flushed, Conn, Back, More, Hits, TlsOutcome,
                Fallback, Lead, Granted, LeadDone, Missed]
_BY_TAG: dict[str, type] = {cls.TAG: cls for cls in (Follower, Ready, Rows, Put, Drop, Synced, Flush, Flushed, Conn,
                                                      Back, More, Hits, TlsOutcome, Fallback, Lead, Granted, LeadDone,
                                                      Missed)}
_FIELDS: dict[type, frozenset[str]] = {cls: frozenset(f.name for f in fields(cls)) for cls in _BY_TAG.values()}


def encode(message: Message, tail: bytes = b"") -> bytes:
    """The record for `message` and `tail`. Its fields are read as they are, not
    through `asdict`, whose deep copy of a Put's or a LeadDone's records cost a
    follower's fill more than their JSON does: JSON writes a tuple as a list either way."""
    raw = _ENCODER.encode({"t": message.TAG, **{name: getattr(message, name) for name in _NAMES[type(message)]}}).encode()
    return _LEN.pack(len(raw)) + raw + tail


_NAMES: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in _BY_TAG.values()}
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def decode(record: bytes) -> tuple[Message | Unknown, bytes]:
    """The message and tail of a record; ValueError when it is not one."""
    try:
        (n,) = _LEN.unpack_from(record)
        head = json.loads(record[4:4 + n])
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a record: {e}") from e
    if not isinstance(head, dict) or not isinstance(head.get("t"), str):
        raise ValueError(f"not a record: a head without a tag ({str(head)[:80]})")
    tag = head.pop("t")
    cls = _BY_TAG.get(tag)
    if cls is None:
        return Unknown(tag), record[4 + n:]
    if not set(head) <= _FIELDS[cls]:
        raise ValueError(f"record {tag!r} has fields {sorted(set(head) - _FIELDS[cls])} it does not take")
    try:
        return cls(**head), record[4 + n:]
    except TypeError as e:  # a field it needs is missing
        raise ValueError(f"record {tag!r}: {e}") from e
