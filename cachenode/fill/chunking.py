"""Whether a fill's answer is an object stored as chunks across the ring,
and a cold fill's first request as the first chunk's range: decisions on
an answer's fields (the asking is fill/engine.py's), and the HEAD that
gives such an object's manifest the whole object's fields.

An object at least its origin's `chunk_threshold` long is stored as chunks
(nezha/chunks.py); the fill learns the length from the origin's answer.
Asked with a plain GET, a chunked object's answer was closed unread once
its length was known, and the origin had sent what its link and buffers
held by then: up to 0.03 of an 8 MiB object in the stampede benchmark
(docs/benchmarks.md, "Stampede"). Asked for the first chunk's range
(`first_chunk_range`), the origin's 206 says the length in its
Content-Range and its body is chunk 0, which the node stores
(cachenode/chunks/adopted.py `AdoptedChunks.adopt`): no byte of it is thrown away. An
object below the threshold comes in the same 206 when it is no longer than
a chunk, else with the rest fetched after it in ranges (a resumed fill's
path, fill/engine.py); an origin that ignores Range answers 200, the whole
object, filled as any.

That second request is the price for an object between a chunk and the
threshold, so the first chunk is asked for only when the threshold is at
most FIRST_CHUNK_UP_TO: above it the bytes a closed answer costs are a
small share of any chunked object (a few hundred KiB of at least 256 MiB),
and the node-wide default (1 GiB, 64 MiB chunks) keeps one plain GET. A
chunked object's manifest takes the whole object's fields from a HEAD
(`whole_fields`, no body byte): the 206 leaves off its digests.
"""

from __future__ import annotations

from typing import Mapping

from multidict import CIMultiDict

from cachenode.fill.flights import Source
from cachenode.fill.lead import Resume, answered_span
from cachenode.fill.parallel import if_range_validator, parallel_validator
from cachenode.fill.upstream import Upstream
from cachenode.store.objects import Meta
from nezha.chunks import Manifest, chunks_on
from nezha.config import Origin
from nezha.errors import NezhaError
from nezha.wire import CHUNKED_HEADER

FIRST_CHUNK_UP_TO = 256 * 2**20


def chunked_as(status: int, headers: Mapping[str, str], length: int | None, *, peer: bool,
               chunking: tuple[int, int], spread: bool, plain: bool) -> tuple[int | None, int]:
    """The chunk size to store an answer's object in across the ring and the
    object's length, or (None, 0) to store it whole.

    From the origin: a 200 at least the origin's chunk_threshold long
    (`chunking`: its threshold and chunk size), with byte ranges and a strong
    validator (each chunk is a Range + If-Range under it, as a parallel
    fill's slices are), `plain` (not varying, not an `authorize` origin's:
    each read is the origin's to allow, not the parent tier's), and only on a
    node with others in its ring (`spread`). From a `peer`: its answer says
    it is a manifest (CHUNKED_HEADER; a replica or a hand-off copies the
    manifest alone)."""
    if peer:
        said = headers.get(CHUNKED_HEADER)
        if said is None or status != 200:
            return None, 0
        try:
            manifest = Manifest.decode(said)
        except ValueError:
            return None, 0
        return manifest.chunk_size, manifest.length
    threshold, chunk_size = chunking
    if not plain or not spread or not chunks_on(threshold, length):
        return None, 0
    # streams=2: a chunked object is fetched in ranges whatever the node's fill_streams.
    if parallel_validator(status, headers, length, streams=2, threshold=threshold) is None:
        return None, 0
    return chunk_size, length or 0


def resumed_span(resume: Resume, status: int, headers: Mapping[str, str], *, chunking: tuple[int, int],
                 spread: bool) -> tuple[int, int, int] | None:
    """The span a resume's answer brings (first, end exclusive, object
    length), when the fill can start from it: the range asked, of a version
    a later range can be pinned to, of an object not stored as chunks
    across the ring; else None."""
    span = answered_span(resume, status, headers.get("Content-Range"))
    if span is None or not _pinned(headers) or (spread and chunks_on(chunking[0], span[2])):
        return None
    return span


def first_chunk_range(source: Source, stale: Meta | None, origin: Origin, *, chunking: tuple[int, int],
                      spread: bool) -> str | None:
    """The Range a cold fill asks the origin for first, or None (a plain
    GET): an origin chunking from a threshold of at most FIRST_CHUNK_UP_TO
    (`chunking`: its threshold and chunk size), a ring to spread chunks over,
    a whole read (a range may need no byte of chunk 0), no resume, not
    through the parent tier, not signed."""
    threshold, chunk_size = chunking
    # The request's fields last: a multidict of them is built for the one test
    # the others (a lone node, the default threshold: most fills) make moot.
    if (not spread or not 0 < threshold <= FIRST_CHUNK_UP_TO or source.peer is not None or source.route is not None
            or source.resume is not None or stale is not None or source.ranged or origin.credentials == "authorize"
            or "Range" in CIMultiDict(source.headers)):
        return None
    return f"bytes=0-{chunk_size - 1}"


def first_chunk_span(asked: str, status: int, headers: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(0, end exclusive, object length) of a 206 that answers the first
    chunk's range `asked` exactly, of a version a later range can be pinned
    to; None for any other answer (a 200 is the whole object: an origin
    that ignores Range)."""
    last = int(asked.rpartition("-")[2])
    span = answered_span(Resume(first=0, last=last, if_range=""), status, headers.get("Content-Range"))
    return span if span is not None and _pinned(headers) else None


def _pinned(headers: Mapping[str, str]) -> bool:
    """Whether a later Range can be pinned to this answer's version with
    If-Range: a strong ETag or a Last-Modified, and no Vary."""
    return (if_range_validator(headers) is not None and not headers.get("ETag", "").startswith("W/")
            and "Vary" not in headers)


async def whole_fields(upstream: Upstream, source: Source, answered: Mapping[str, str]) -> CIMultiDict[str] | None:
    """The whole object's fields for the manifest of a chunked object whose
    first chunk's 206 (`answered`) told its size, from a HEAD: a 206 leaves
    off those that describe the whole body (the origin's digests, which
    whole reads of the object are checked against, chunks/whole.py). None
    when the HEAD fails or answers another version: the 206's fields stand."""
    try:
        head = await upstream.request("HEAD", source.url, headers=source.headers, what=source.what)
    except NezhaError:
        return None
    try:
        if head.status != 200 or not _same_version(head.headers, answered):
            return None
        return head.headers.copy()
    finally:
        head.release()


def _same_version(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two answers are of one version: the same strong ETag, else (one of them without) the same
    Last-Modified."""
    va, vb = if_range_validator(a), if_range_validator(b)
    if va is None or vb is None:
        return False
    if va.etag is not None and vb.etag is not None:
        return va.etag == vb.etag
    return va.last_modified is not None and va.last_modified == vb.last_modified
