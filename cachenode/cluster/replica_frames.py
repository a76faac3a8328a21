"""The body of a batched replica push: small objects one after another, each checked alone. Pure.

A node that filled many small objects pushes their replicas to each other
owner in one request (cluster/replica_batches.py sends, cluster/replica_intake.py
receives) instead of one replicate call and one copy request per object:
for a 16 KiB object the two HTTP exchanges cost more than its bytes.

    body   = record*
    record = head | meta (JSON, meta_len bytes) | object body (body_len bytes)
    head   = MAGIC (4) | meta_len (u32) | body_len (u32) | CRC32C of meta + body (u32)
             | CRC32C of the 16 bytes before it (u32)          -- big-endian, 20 bytes

Why a checksum per record and one of its own for the head: a record whose
meta or body is damaged on the way is refused alone, and the records after
it are still found, since the lengths that lead to them are proved by the
head's own checksum. A head that fails its checksum leaves nothing to find
the next record by: the receiver stops there, and the sender copies what it
did not hear about one by one (docs/cache-node.md, "Replicas").

CRC32C guards against accidents (a flipped bit in a peer's memory or on the
way), not against a peer that lies on purpose: the cluster token keeps
strangers out of the endpoint.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import google_crc32c

MAGIC = b"NZR1"
_HEAD = struct.Struct(">4sIII")
HEAD_SIZE = _HEAD.size + 4
CONTENT_TYPE = "application/x-nezha-replicas"
# A record's meta is a stored object's `Meta` (cachenode/store/objects.py);
# its body a small object's bytes. Beyond these a head is taken for damage.
MAX_META = 1 << 20
MAX_BODY = 16 << 20


class BrokenFrame(ValueError):
    """A head that is not one: the stream cannot be followed past it."""


@dataclass(frozen=True, slots=True)
class Head:
    meta_len: int
    body_len: int
    crc: int  # of meta + body

    @property
    def payload(self) -> int:
        return self.meta_len + self.body_len


def _crc(*parts: bytes | memoryview) -> int:
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, bytes(part))
    return crc


def encode(record: dict, body: bytes | memoryview) -> bytes:
    """One record: `record` (a Meta as a dict) and `body`, framed and checksummed."""
    meta = json.dumps(record, separators=(",", ":")).encode()
    head = _HEAD.pack(MAGIC, len(meta), len(body), _crc(meta, body))
    return b"".join((head, struct.pack(">I", _crc(head)), meta, bytes(body)))


def read_head(raw: bytes) -> Head:
    """The head in `raw` (HEAD_SIZE bytes); BrokenFrame when it is not one."""
    if len(raw) != HEAD_SIZE:
        raise BrokenFrame(f"a head is {HEAD_SIZE} bytes, got {len(raw)}")
    magic, meta_len, body_len, crc = _HEAD.unpack(raw[:_HEAD.size])
    (own,) = struct.unpack(">I", raw[_HEAD.size:])
    if _crc(raw[:_HEAD.size]) != own:
        raise BrokenFrame("the head's checksum does not match: the stream is damaged here")
    if magic != MAGIC:
        raise BrokenFrame(f"no record here: starts with {magic!r}")
    if meta_len > MAX_META or body_len > MAX_BODY:
        raise BrokenFrame(f"a record of {meta_len} + {body_len} bytes is beyond {MAX_META} + {MAX_BODY}")
    return Head(meta_len=meta_len, body_len=body_len, crc=crc)


class Damaged(ValueError):
    """A record whose bytes are not the ones its sender's checksum names."""


def open_record(head: Head, payload: bytes) -> tuple[dict, memoryview]:
    """(meta, body) of the record `head` leads, its `payload` (meta + body)
    checked first; Damaged when the checksum or the meta does not hold."""
    if len(payload) != head.payload:
        raise Damaged(f"{len(payload)} bytes of a record of {head.payload}")
    got = _crc(payload)
    if got != head.crc:
        raise Damaged(f"CRC32C {got:08x}, its sender's {head.crc:08x}")
    view = memoryview(payload)
    try:
        meta = json.loads(bytes(view[:head.meta_len]))
    except ValueError as e:
        raise Damaged(f"its meta is not JSON: {e}") from e
    if not isinstance(meta, dict):
        raise Damaged("its meta is not an object")
    return meta, view[head.meta_len:]
