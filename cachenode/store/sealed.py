"""A small object's one file: its body, then its record, then a trailer that seals both. Pure.

    [ body: size bytes ][ record: JSON, n bytes ][ trailer: 16 bytes ]
    trailer = MAGIC (8 bytes) | n (uint32, big-endian) | CRC32C of body + record (uint32, big-endian)

Why one file and a checksum instead of two files and two fsyncs: a small
object (a JPEG of an image dataset) is written in one go and made durable
with others by a periodic group sync (cachenode/store/syncer.py), not by an
fsync of its own. Until that sync, a crash (power loss; `kill -9` loses
nothing the kernel already holds) may leave the file short, zero-filled or
half old: the trailer's checksum tells such a file from a whole one, so
start-up and every read drop it instead of serving it, and the next
request fetches the object again.

Why a trailer and not a header: the body starts at byte 0, as a large
object's data file does, so every reader (sendfile on a hit, a chunk owner,
a copy to a peer) sends `[0, size)` of the file it opens and knows nothing
of the format. Only what checks the seal reads past the body.

CRC32C (google-crc32c, the hardware instruction where the CPU has it)
detects every burst error up to 32 bits and any torn write with
probability 1 - 2^-32: it guards against accidents (a torn write, a
flipped bit on disk), not against someone who writes the disk on purpose.
"""

from __future__ import annotations

import json
import struct

import google_crc32c

MAGIC = b"NZSMALL1"
_TRAILER = struct.Struct(">8sII")
TRAILER_SIZE = _TRAILER.size
# A record is an object's metadata (cachenode/store/objects.py `Meta`):
# headers the origin sent, kept whole. Beyond this, it is not one.
MAX_RECORD = 1 << 20
# `json.dumps(record, separators=(",", ":"))`, its encoder made once rather than on every call,
# and without the check for a record that holds itself (its values are a `Meta`'s: immutable,
# none holds another): the same bytes, a tenth less time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)


class Unsealed(ValueError):
    """A file that is not a whole sealed object: short, torn, or not the format."""


def encode_record(record: dict) -> bytes:
    """`record` as a sealed file holds it: `json.dumps(record, separators=(",", ":"))`."""
    return _ENCODER.encode(record).encode()


def seal(body: bytes | memoryview, record: dict) -> bytes:
    """The bytes that follow `body` in its file: its record and the trailer over both."""
    return seal_encoded(body, encode_record(record))


def seal_encoded(body: bytes | memoryview, raw: bytes) -> bytes:
    """`seal` of the record whose JSON (`encode_record`'s) is `raw`."""
    crc = google_crc32c.extend(google_crc32c.value(bytes(body)), raw)
    return raw + _TRAILER.pack(MAGIC, len(raw), crc)


def record_length(tail: bytes) -> int:
    """The record's length a file's last TRAILER_SIZE bytes give; Unsealed if they are no trailer."""
    if len(tail) != TRAILER_SIZE:
        raise Unsealed(f"a trailer is {TRAILER_SIZE} bytes, got {len(tail)}")
    magic, n, _ = _TRAILER.unpack(tail)
    if magic != MAGIC:
        raise Unsealed(f"no trailer: ends with {magic!r}")
    if n > MAX_RECORD:
        raise Unsealed(f"record of {n} bytes is larger than {MAX_RECORD}")
    return n


def unseal(whole: bytes | memoryview) -> tuple[int, dict]:
    """(body size, record) of a whole file's bytes; Unsealed if the seal does not hold."""
    view = memoryview(whole)
    if len(view) < TRAILER_SIZE:
        raise Unsealed(f"{len(view)} bytes: shorter than a trailer")
    n = record_length(bytes(view[-TRAILER_SIZE:]))
    size = len(view) - TRAILER_SIZE - n
    if size < 0:
        raise Unsealed(f"record of {n} bytes does not fit in a file of {len(view)}")
    _, _, crc = _TRAILER.unpack(view[-TRAILER_SIZE:])
    if google_crc32c.value(bytes(view[:-TRAILER_SIZE])) != crc:
        raise Unsealed("checksum does not match: torn or damaged")
    try:
        record = json.loads(bytes(view[size:size + n]))
    except ValueError as e:
        raise Unsealed(f"record is not JSON: {e}") from e
    if not isinstance(record, dict):
        raise Unsealed("record is not an object")
    return size, record
