"""The digests an origin publishes of a whole object, and a check of the
bytes against one as they pass. Pure: no I/O.

A dataset cache that stores one wrong byte serves it to every job on every
node until someone notices a training run diverging, so a fill checks
the bytes it stores against what the origin says they are, whenever the
origin says it (issue 37; docs/cache-node.md, "Verified bytes"). Origins
say it in many dialects, each read here into one `Expected`:

- S3: `x-amz-checksum-crc32`, `-crc32c`, `-crc64nvme`, `-sha1`, `-sha256`
  (base64 of the big-endian value), sent when the request asked for them
  (`x-amz-checksum-mode: ENABLED`). A multipart upload's checksum may be
  composite (`x-amz-checksum-type: COMPOSITE`, the value ending `-N`): a
  checksum of its parts' checksums, which no pass over the object's bytes
  reproduces. It is reported `Ignored`, never checked as a whole-object one.
- GCS: `x-goog-hash: crc32c=..., md5=...` (a composite object has crc32c
  only), of the stored bytes: ignored when GCS decompresses them on the way
  (`x-goog-stored-content-encoding` other than the response's coding).
- `Content-MD5` (RFC 1864): of the body as sent.
- RFC 9530 `Repr-Digest` (of the representation: the body of a 200), and
  `Content-Digest` on a 200 without content coding, `sha-256` and `sha-512`
  (the other registered algorithms are deprecated and not checked).
- Hugging Face: `X-Linked-ETag`, the sha256 of an LFS file, on the answer
  that redirected to the bytes (it names the target, not itself): the
  caller hands it in. A 40-hex value is a git blob id (a hash of a header
  and the bytes), not checked.

Only a 200 is checked: a 206 carries a part, and the digests above are of
the whole. Of several digests one is checked, the cheapest to compute
(`CHEAPEST_FIRST`, from a measurement in the module's tests' notes): they
all name the same bytes, and one wrong byte fails any of them.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import operator
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import http_sf

from cachenode.http.fields import lines_of


class Algorithm(enum.Enum):
    CRC32 = "crc32"
    CRC32C = "crc32c"
    CRC64NVME = "crc64nvme"
    SHA1 = "sha1"
    SHA256 = "sha256"
    SHA512 = "sha512"
    MD5 = "md5"


# Bytes of each algorithm's value.
SIZES = {Algorithm.CRC32: 4, Algorithm.CRC32C: 4, Algorithm.CRC64NVME: 8, Algorithm.SHA1: 20,
         Algorithm.SHA256: 32, Algorithm.SHA512: 64, Algorithm.MD5: 16}

# One core here, MB/s: crc64nvme 17000, crc32c 18000 (awscrt; google-crc32c
# 8500), crc32 2600 (zlib), sha1 1800 and sha256 1700 (SHA-NI), md5 700,
# sha512 550.
CHEAPEST_FIRST = (Algorithm.CRC64NVME, Algorithm.CRC32C, Algorithm.CRC32, Algorithm.SHA256, Algorithm.SHA1,
                  Algorithm.MD5, Algorithm.SHA512)

_AMZ_PREFIX = "x-amz-checksum-"
_AMZ = {"crc32": Algorithm.CRC32, "crc32c": Algorithm.CRC32C, "crc64nvme": Algorithm.CRC64NVME,
        "sha1": Algorithm.SHA1, "sha256": Algorithm.SHA256}
_GOOG = {"crc32c": Algorithm.CRC32C, "md5": Algorithm.MD5}
# The fields any reader of `expectations` takes a digest from, or sets one aside from (with x-amz-checksum-*).
_PUBLISHING = frozenset({"x-goog-hash", "content-md5", "repr-digest", "content-digest"})
_amz = operator.methodcaller("startswith", _AMZ_PREFIX)  # whether a lowercased name is an x-amz-checksum-* one
# RFC 9530 §5 / the IANA registry's non-deprecated algorithms.
_SF = {"sha-256": Algorithm.SHA256, "sha-512": Algorithm.SHA512}
_SF_NAME = {v: k for k, v in _SF.items()}


@dataclass(frozen=True)
class Expected:
    """A whole-object digest an origin published: its value, and the header field it came in."""

    algorithm: Algorithm
    value: bytes
    field: str  # e.g. "x-amz-checksum-sha256", "x-goog-hash", "Repr-Digest"

    def shown(self) -> str:
        return show(self.algorithm, self.value)


@dataclass(frozen=True)
class Ignored:
    """A digest field that is not checked, and why (a composite checksum, a malformed value...)."""

    field: str
    reason: str


@dataclass(frozen=True)
class Expectations:
    """What a response says its bytes are: the digests to check, and those set aside."""

    expected: tuple[Expected, ...] = ()
    ignored: tuple[Ignored, ...] = ()

    def cheapest(self) -> Expected | None:
        """The one digest a fill checks (every published digest names the same bytes)."""
        if not self.expected:
            return None  # most answers publish none
        for algorithm in CHEAPEST_FIRST:
            for e in self.expected:
                if e.algorithm is algorithm:
                    return e
        return None

    def of(self, algorithm: Algorithm) -> Expected | None:
        return next((e for e in self.expected if e.algorithm is algorithm), None)


_NOTHING = Expectations()  # immutable: one for every answer that publishes nothing


def show(algorithm: Algorithm, value: bytes) -> str:
    """A digest as a log line shows it: `sha256:<base64>` (the encoding the headers above use)."""
    return f"{algorithm.value}:{base64.b64encode(value).decode('ascii')}"


def _items(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    items = getattr(headers, "items", None)
    return list(items() if items is not None else headers)


def _b64(value: str, algorithm: Algorithm) -> bytes | None:
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == SIZES[algorithm] else None


def expectations(headers: Mapping[str, str] | Iterable[tuple[str, str]], *, status: int,
                 linked_etag: str | None = None) -> Expectations:
    """The whole-object digests a response with `headers` and `status`
    publishes; `linked_etag`: the X-Linked-ETag of the answer that
    redirected here (Hugging Face), if any."""
    if status != 200:
        return Expectations()
    lines = lines_of(headers)  # a fill's: lowercased once already, by its judging
    if linked_etag is None and not lines.of_names(_publishing):
        return _NOTHING  # most answers publish no digest: none of the readers below would find one
    found = _Found(fields=lines.by_name())
    # One dialect at a time, in this order (the order of `expected`).
    _read_amz(found)
    _read_goog(found)
    md5 = found.one("content-md5")
    if md5 is not None:
        found.take(Algorithm.MD5, _b64(md5, Algorithm.MD5), "Content-MD5", md5)
    _read_structured(found)
    if linked_etag is not None:
        _read_linked(found, linked_etag)
    return Expectations(tuple(found.expected), tuple(found.ignored))


def _publishing(lowered: tuple[str, ...]) -> bool:
    """Whether a message whose lowercased field names are `lowered` has a
    field any reader of `expectations` takes a digest from or sets one aside from."""
    return not _PUBLISHING.isdisjoint(lowered) or any(map(_amz, lowered))


@dataclass
class _Found:
    """The header fields of one response (lower-cased names) and what
    `expectations` has read from them so far."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    expected: list[Expected] = field(default_factory=list)
    ignored: list[Ignored] = field(default_factory=list)

    def one(self, name: str) -> str | None:
        values = self.fields.get(name)
        return ",".join(values) if values else None

    def take(self, algorithm: Algorithm, raw: bytes | None, source: str, value: str) -> None:
        """Expect `raw` if `value` decoded to one, else set `source` aside."""
        if raw is None:
            self.ignored.append(Ignored(source, f"{value[:100]!r} is not a {algorithm.value} value"))
        else:
            self.expected.append(Expected(algorithm, raw, source))


def _read_amz(found: _Found) -> None:
    """S3's x-amz-checksum-*: a composite (multipart) one is set aside."""
    kind = (found.one("x-amz-checksum-type") or "").strip().upper()
    for name, values in found.fields.items():
        if not name.startswith(_AMZ_PREFIX) or name == "x-amz-checksum-type" or name == "x-amz-checksum-mode":
            continue
        algorithm = _AMZ.get(name[len(_AMZ_PREFIX):])
        value = values[0].strip()
        if algorithm is None:
            found.ignored.append(Ignored(name, "an algorithm this cache does not check"))
        elif kind not in ("", "FULL_OBJECT") or _composite(value):
            found.ignored.append(Ignored(name, f"a composite checksum of a multipart upload's parts ({value[:100]}, "
                                               f"type {kind or 'absent'}), not of the object's bytes"))
        else:
            found.take(algorithm, _b64(value, algorithm), name, value)


def _read_goog(found: _Found) -> None:
    """GCS's x-goog-hash: of the stored bytes, so set aside when GCS
    decoded them on the way."""
    goog = found.one("x-goog-hash")
    if goog is None:
        return
    stored_coding = (found.one("x-goog-stored-content-encoding") or "identity").strip().lower()
    coding = (found.one("content-encoding") or "identity").strip().lower()
    if stored_coding != coding:
        found.ignored.append(Ignored("x-goog-hash", f"of the stored {stored_coding} bytes; these are {coding}"))
        return
    for member in goog.split(","):
        algo, sep, value = member.strip().partition("=")
        algorithm = _GOOG.get(algo.strip().lower())
        if not sep or algorithm is None:
            found.ignored.append(Ignored("x-goog-hash", f"{member.strip()[:100]!r}: not crc32c= or md5="))
            continue
        found.take(algorithm, _b64(value, algorithm), "x-goog-hash", value)


def _read_structured(found: _Found, names: tuple[str, ...] = ("Repr-Digest", "Content-Digest")) -> None:
    """RFC 9530's Repr-Digest, and Content-Digest when no content coding
    stands between it and the representation."""
    coded = (found.one("content-encoding") or "identity").strip().lower() not in ("", "identity")
    for name in names:
        value = found.one(name.lower())
        if value is None:
            continue
        if name == "Content-Digest" and coded:
            found.ignored.append(Ignored(name, "of content with a content coding"))
            continue
        try:
            members = http_sf.parse(value.encode("ascii"), tltype="dictionary")
        except (http_sf.StructuredFieldError, UnicodeEncodeError) as e:
            found.ignored.append(Ignored(name, f"not a structured-field dictionary: {e}"))
            continue
        for key, (item, _params) in members.items():
            algorithm = _SF.get(key)
            if algorithm is None:
                found.ignored.append(Ignored(name, f"{key}: an algorithm this cache does not check"))
            elif not isinstance(item, bytes) or len(item) != SIZES[algorithm]:
                found.ignored.append(Ignored(name, f"{key}: not a {algorithm.value} byte sequence"))
            else:
                found.expected.append(Expected(algorithm, item, name))


def _read_linked(found: _Found, linked_etag: str) -> None:
    """Hugging Face's X-Linked-ETag: an LFS file's sha256; 40 hex digits
    are a git blob id, not a digest of the bytes alone."""
    hexed = linked_etag.strip().removeprefix("W/").strip('"')
    if len(hexed) != 64:
        found.ignored.append(Ignored("X-Linked-ETag", f"{linked_etag[:100]!r} is not a sha256 (a git blob id?)"))
        return
    try:
        found.expected.append(Expected(Algorithm.SHA256, bytes.fromhex(hexed), "X-Linked-ETag"))
    except ValueError:
        found.ignored.append(Ignored("X-Linked-ETag", f"{linked_etag[:100]!r} is not hex"))


def of_the_whole_in_a_part(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> Expectations:
    """The whole-object digests a 206 publishes: only `Repr-Digest`, which
    RFC 9530 §3 defines over the selected representation, whatever part of it
    the message carries. The others are set aside: `Content-MD5` and
    `Content-Digest` digest the part, and no store documents that its
    checksums on a ranged answer are of the whole (S3 sends none there)."""
    found = _Found(fields=lines_of(headers).by_name())
    _read_structured(found, names=("Repr-Digest",))
    return Expectations(tuple(found.expected), tuple(found.ignored))


def carry(expected: Expected) -> str:
    """The value of `X-Nezha-Digest` (nezha/wire.py) that hands `expected` to a
    peer: a structured-field dictionary, `<algorithm>=:<base64>:;from="<field>"`."""
    return http_sf.ser({expected.algorithm.value: (expected.value, {"from": expected.field})})


def carried(value: str | None) -> Expected | None:
    """The digest a peer handed on in `X-Nezha-Digest`, or None (absent or malformed)."""
    if not value:
        return None
    try:
        members = http_sf.parse(value.encode("ascii"), tltype="dictionary")
    except (http_sf.StructuredFieldError, UnicodeEncodeError):
        return None
    for key, (item, params) in members.items():
        algorithm = next((a for a in Algorithm if a.value == key), None)
        if algorithm is not None and isinstance(item, bytes) and len(item) == SIZES[algorithm]:
            source = params.get("from")
            return Expected(algorithm, item, f"{source if isinstance(source, str) else key} via X-Nezha-Digest")
    return None


def _composite(value: str) -> bool:
    """S3's composite checksums end `-<parts>`; base64 has no '-'."""
    head, sep, parts = value.rpartition("-")
    return bool(sep) and parts.isdigit()


class Verifier:
    """One digest computed over bytes fed in order, then compared with the expected value."""

    def __init__(self, expected: Expected) -> None:
        self.expected = expected
        self.fed = 0
        algorithm = expected.algorithm
        self._crc = 0
        self._hash = None
        if algorithm is Algorithm.CRC32:
            self._update = self._crc32
        elif algorithm in (Algorithm.CRC32C, Algorithm.CRC64NVME):
            # Imported on first use: awscrt takes about 0.1 s to import
            # here, which a node that never meets these checksums need not pay.
            from awscrt import checksums
            self._update = self._crc32c if algorithm is Algorithm.CRC32C else self._crc64nvme
            self._checksums = checksums
        else:
            self._hash = hashlib.new(algorithm.value)
            self._update = self._hash.update

    def _crc32(self, data) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def _crc32c(self, data) -> None:
        self._crc = self._checksums.crc32c(data, self._crc)

    def _crc64nvme(self, data) -> None:
        self._crc = self._checksums.crc64nvme(data, self._crc)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._update(data)
        self.fed += len(data)

    def digest(self) -> bytes:
        if self._hash is not None:
            return self._hash.digest()
        return self._crc.to_bytes(SIZES[self.expected.algorithm], "big")

    def mismatch(self) -> "Mismatch | None":
        """None when the bytes fed are what the origin published; else both digests."""
        got = self.digest()
        if got == self.expected.value:
            return None
        return Mismatch(expected=self.expected, got=show(self.expected.algorithm, got), length=self.fed)


@dataclass(frozen=True)
class Mismatch:
    expected: Expected
    got: str  # the digest of the bytes that came, shown as `show` shows it
    length: int

    def __str__(self) -> str:
        return (f"{self.expected.field} says {self.expected.shown()}, the {self.length} bytes that came "
                f"hash to {self.got}")


def want_repr_digest(want: str | None, known: Expectations) -> str | None:
    """The `Repr-Digest` to answer a request's `Want-Repr-Digest` (RFC 9530
    §4) with, from the sha-256/sha-512 digests the node knows of the
    object; None when the client asked for none, refused every one it
    knows (weight 0), or the node knows none."""
    if not want:
        return None
    try:
        prefs = http_sf.parse(want.encode("ascii"), tltype="dictionary")
    except (http_sf.StructuredFieldError, UnicodeEncodeError):
        return None
    ranked = sorted(((item, name) for name, (item, _p) in prefs.items()
                     if name in _SF and isinstance(item, int) and not isinstance(item, bool) and item > 0),
                    reverse=True)
    for _weight, name in ranked:
        e = known.of(_SF[name])
        if e is not None:
            return http_sf.ser({name: (e.value, {})})
    return None


def repr_digest_for(want: str | None, headers: Mapping[str, str] | Iterable[tuple[str, str]], *,
                    status: int) -> str | None:
    """The `Repr-Digest` field to add to a stored object's answer (`headers`,
    `status`: as the origin sent them) for a client's `Want-Repr-Digest`:
    None when it sent none, or the origin's own Repr-Digest already answers it."""
    if not want or any(name.lower() == "repr-digest" for name, _ in _items(headers)):
        return None
    return want_repr_digest(want, expectations(headers, status=status))
