"""The digests origins publish, read into expectations, and the check of bytes against them."""

import base64
import hashlib

import pytest

from cachenode.http.digests import (Algorithm, Expected, Verifier, carried, carry, expectations,
                                    of_the_whole_in_a_part, want_repr_digest)

BODY = b"the bytes of a dataset shard " * 1000


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# Known-answer vectors: the check value of each CRC over b"123456789"
# (the CRC catalogue), and RFC 6234 / RFC 1321 digests.
VECTORS = [
    (Algorithm.CRC32, b"123456789", bytes.fromhex("cbf43926")),
    (Algorithm.CRC32C, b"123456789", bytes.fromhex("e3069283")),
    (Algorithm.CRC64NVME, b"123456789", bytes.fromhex("ae8b14860a799888")),
    (Algorithm.SHA1, b"abc", bytes.fromhex("a9993e364706816aba3e25717850c26c9cd0d89d")),
    (Algorithm.SHA256, b"abc", bytes.fromhex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")),
    (Algorithm.MD5, b"abc", bytes.fromhex("900150983cd24fb0d6963f7d28e17f72")),
    (Algorithm.SHA512, b"abc", hashlib.sha512(b"abc").digest()),
]


def digest_of(algorithm: Algorithm, data: bytes) -> bytes:
    v = Verifier(Expected(algorithm, b"", "test"))
    v.update(data)
    return v.digest()


@pytest.mark.parametrize("algorithm,data,value", VECTORS, ids=[v[0].value for v in VECTORS])
def test_each_algorithm_computes_its_known_answer_fed_in_pieces(algorithm, data, value):
    """Fed one byte at a time or whole, each verifier gives the catalogue's value."""
    whole, pieces = Verifier(Expected(algorithm, value, "t")), Verifier(Expected(algorithm, value, "t"))
    whole.update(data)
    for i in range(len(data)):
        pieces.update(memoryview(data)[i:i + 1])
    assert whole.digest() == pieces.digest() == value
    assert whole.mismatch() is None and pieces.fed == len(data)


def amz(name: str, algorithm: Algorithm, **extra: str) -> list[tuple[str, str]]:
    return [(f"x-amz-checksum-{name}", b64(digest_of(algorithm, BODY)))] + list(extra.items())


CHECKED = [
    ("s3 crc32", amz("crc32", Algorithm.CRC32), Algorithm.CRC32, "x-amz-checksum-crc32"),
    ("s3 crc32c", amz("crc32c", Algorithm.CRC32C), Algorithm.CRC32C, "x-amz-checksum-crc32c"),
    ("s3 crc64nvme full object", amz("crc64nvme", Algorithm.CRC64NVME) + [("x-amz-checksum-type", "FULL_OBJECT")],
     Algorithm.CRC64NVME, "x-amz-checksum-crc64nvme"),
    ("s3 sha1", amz("sha1", Algorithm.SHA1), Algorithm.SHA1, "x-amz-checksum-sha1"),
    ("s3 sha256", [("X-Amz-Checksum-SHA256", b64(hashlib.sha256(BODY).digest()))], Algorithm.SHA256,
     "x-amz-checksum-sha256"),
    ("gcs crc32c", [("x-goog-hash", f"crc32c={b64(digest_of(Algorithm.CRC32C, BODY))}")], Algorithm.CRC32C,
     "x-goog-hash"),
    ("gcs md5", [("x-goog-hash", f"md5={b64(hashlib.md5(BODY).digest())}")], Algorithm.MD5, "x-goog-hash"),
    ("content-md5", [("Content-MD5", b64(hashlib.md5(BODY).digest()))], Algorithm.MD5, "Content-MD5"),
    ("repr-digest sha-256", [("Repr-Digest", f"sha-256=:{b64(hashlib.sha256(BODY).digest())}:")],
     Algorithm.SHA256, "Repr-Digest"),
    ("repr-digest sha-512", [("Repr-Digest", f"sha-512=:{b64(hashlib.sha512(BODY).digest())}:")],
     Algorithm.SHA512, "Repr-Digest"),
    ("content-digest sha-256", [("Content-Digest", f"sha-256=:{b64(hashlib.sha256(BODY).digest())}:")],
     Algorithm.SHA256, "Content-Digest"),
]


@pytest.mark.parametrize("headers,algorithm,field", [c[1:] for c in CHECKED], ids=[c[0] for c in CHECKED])
def test_each_published_digest_is_read_and_checks_the_right_bytes_and_not_wrong_ones(headers, algorithm, field):
    """Every dialect gives one expectation; the right bytes pass it, one flipped byte fails it."""
    known = expectations(headers, status=200)
    assert [(e.algorithm, e.field) for e in known.expected] == [(algorithm, field)]
    assert known.ignored == ()
    good = Verifier(known.cheapest())
    good.update(BODY)
    assert good.mismatch() is None
    bad = Verifier(known.cheapest())
    bad.update(BODY[:100] + bytes([BODY[100] ^ 1]) + BODY[101:])
    mismatch = bad.mismatch()
    assert mismatch is not None and mismatch.expected.field == field
    assert mismatch.got != mismatch.expected.shown() and mismatch.got.startswith(algorithm.value + ":")


def test_hugging_face_linked_etag_of_the_redirect_is_a_sha256():
    """X-Linked-ETag, quoted as Hugging Face sends it, is the sha256 the bytes must have."""
    known = expectations([], status=200, linked_etag=f'"{hashlib.sha256(BODY).hexdigest()}"')
    assert known.cheapest().field == "X-Linked-ETag"
    v = Verifier(known.cheapest())
    v.update(BODY)
    assert v.mismatch() is None


def test_a_git_blob_id_in_linked_etag_is_not_checked():
    """A 40-hex X-Linked-ETag hashes a git header with the bytes: set aside, named."""
    known = expectations([], status=200, linked_etag='"' + "a" * 40 + '"')
    assert known.expected == () and known.ignored[0].field == "X-Linked-ETag"


@pytest.mark.parametrize("headers", [
    [("x-amz-checksum-crc32c", "u8MdYA==-3")],
    [("x-amz-checksum-sha256", "u8MdYA==-12"), ("x-amz-checksum-type", "COMPOSITE")],
    [("x-amz-checksum-crc32", "u8MdYA=="), ("x-amz-checksum-type", "COMPOSITE")],
], ids=["suffix", "suffix and type", "type only"])
def test_a_composite_multipart_checksum_is_ignored_and_says_so(headers):
    """A checksum of a multipart upload's parts is never checked as the object's own."""
    known = expectations(headers, status=200)
    assert known.expected == ()
    assert "composite" in known.ignored[0].reason


def test_only_a_200_is_checked():
    """A 206 is a part; the published digests are of the whole."""
    headers = [("x-amz-checksum-crc32c", b64(digest_of(Algorithm.CRC32C, BODY)))]
    assert expectations(headers, status=206).expected == ()
    assert expectations(headers, status=404).expected == ()


def test_of_a_206_only_repr_digest_names_the_whole_object():
    """Repr-Digest is of the representation whatever part a message carries (RFC 9530 §3);
    Content-MD5 and Content-Digest digest the part, and S3's checksums are not vouched for on a range."""
    whole = hashlib.sha256(BODY).digest()
    part = BODY[100:]
    headers = [("Repr-Digest", f"sha-256=:{b64(whole)}:"),
               ("Content-Digest", f"sha-256=:{b64(hashlib.sha256(part).digest())}:"),
               ("Content-MD5", b64(hashlib.md5(part).digest())),
               ("x-amz-checksum-crc32c", b64(digest_of(Algorithm.CRC32C, BODY)))]
    known = of_the_whole_in_a_part(headers)
    assert known.expected == (Expected(Algorithm.SHA256, whole, "Repr-Digest"),)
    assert of_the_whole_in_a_part(headers[1:]).expected == ()


@pytest.mark.parametrize("algorithm", list(Algorithm), ids=[a.value for a in Algorithm])
def test_a_digest_handed_to_a_peer_reads_back_as_the_same_digest_naming_its_field(algorithm):
    expected = Expected(algorithm, digest_of(algorithm, BODY), "X-Linked-ETag")
    back = carried(carry(expected))
    assert back is not None
    assert (back.algorithm, back.value) == (algorithm, expected.value)
    assert back.field == "X-Linked-ETag via X-Nezha-Digest"


@pytest.mark.parametrize("value", [None, "", "sha256=:AAAA:", "nonsense(", "md4=:AAAAAAAAAAAAAAAAAAAAAA==:", "sha256=1"])
def test_a_malformed_handed_on_digest_is_no_digest(value):
    assert carried(value) is None


def test_content_digest_with_a_content_coding_is_not_checked():
    headers = [("Content-Digest", f"sha-256=:{b64(hashlib.sha256(BODY).digest())}:"), ("Content-Encoding", "gzip")]
    known = expectations(headers, status=200)
    assert known.expected == () and known.ignored[0].field == "Content-Digest"


def test_gcs_hash_of_bytes_gcs_decompresses_is_not_checked():
    """Decompressive transcoding: the hash is of the stored gzip, the body is not."""
    headers = [("x-goog-hash", f"crc32c={b64(digest_of(Algorithm.CRC32C, BODY))}"),
               ("x-goog-stored-content-encoding", "gzip")]
    known = expectations(headers, status=200)
    assert known.expected == () and "gzip" in known.ignored[0].reason


def test_gcs_hash_with_both_values_in_one_field_or_two():
    crc, md5 = b64(digest_of(Algorithm.CRC32C, BODY)), b64(hashlib.md5(BODY).digest())
    one = expectations([("x-goog-hash", f"crc32c={crc},md5={md5}")], status=200)
    two = expectations([("x-goog-hash", f"crc32c={crc}"), ("x-goog-hash", f"md5={md5}")], status=200)
    assert {e.algorithm for e in one.expected} == {e.algorithm for e in two.expected} == {Algorithm.CRC32C,
                                                                                           Algorithm.MD5}


def test_the_cheapest_of_several_digests_is_the_one_checked():
    headers = [("Content-MD5", b64(hashlib.md5(BODY).digest())),
               ("x-goog-hash", f"crc32c={b64(digest_of(Algorithm.CRC32C, BODY))}"),
               ("Repr-Digest", f"sha-512=:{b64(hashlib.sha512(BODY).digest())}:")]
    assert expectations(headers, status=200).cheapest().algorithm is Algorithm.CRC32C


@pytest.mark.parametrize("headers,field", [
    ([("x-amz-checksum-sha256", "not base64!")], "x-amz-checksum-sha256"),
    ([("x-amz-checksum-crc32", b64(b"\x00" * 8))], "x-amz-checksum-crc32"),
    ([("Content-MD5", b64(b"short"))], "Content-MD5"),
    ([("Repr-Digest", "sha-256=1")], "Repr-Digest"),
    ([("Repr-Digest", "sha-256=:AAAA:")], "Repr-Digest"),
    ([("Repr-Digest", "((")], "Repr-Digest"),
    ([("Repr-Digest", f"md5=:{b64(hashlib.md5(BODY).digest())}:")], "Repr-Digest"),
    ([("x-goog-hash", "adler=abc")], "x-goog-hash"),
    ([("x-amz-checksum-xxhash64", "AAAAAAAAAAA=")], "x-amz-checksum-xxhash64"),
], ids=["bad base64", "wrong length", "short md5", "integer", "short sf", "not sf", "deprecated algorithm",
        "unknown goog", "unknown amz"])
def test_a_malformed_or_unknown_digest_is_set_aside_never_checked(headers, field):
    """A value the node cannot read must not fail a fill of good bytes: it is ignored, with a reason."""
    known = expectations(headers, status=200)
    assert known.expected == ()
    assert [i.field for i in known.ignored] == [field]


def test_no_digest_no_expectation():
    assert expectations([("ETag", '"abc"'), ("Content-Type", "x")], status=200) == expectations([], status=200)
    assert expectations([], status=200).cheapest() is None


def test_mismatch_names_both_digests():
    known = expectations([("x-amz-checksum-sha256", b64(hashlib.sha256(b"good").digest()))], status=200)
    v = Verifier(known.cheapest())
    v.update(b"evil")
    text = str(v.mismatch())
    assert b64(hashlib.sha256(b"good").digest()) in text and b64(hashlib.sha256(b"evil").digest()) in text


SHA256 = hashlib.sha256(BODY).digest()
KNOWN = expectations([("x-amz-checksum-sha256", b64(SHA256))], status=200)


@pytest.mark.parametrize("want,answer", [
    ("sha-256=1", f"sha-256=:{b64(SHA256)}:"),
    ("sha-512=10, sha-256=3", f"sha-256=:{b64(SHA256)}:"),
    ("sha-256=0", None),
    ("sha-512=5", None),
    ("", None),
    (None, None),
    ("((", None),
])
def test_want_repr_digest_is_answered_with_a_known_digest_the_client_accepts(want, answer):
    assert want_repr_digest(want, KNOWN) == answer


def test_want_repr_digest_prefers_the_clients_higher_weight():
    both = expectations([("Repr-Digest", f"sha-256=:{b64(SHA256)}:, "
                                         f"sha-512=:{b64(hashlib.sha512(BODY).digest())}:")], status=200)
    assert want_repr_digest("sha-256=2, sha-512=9", both).startswith("sha-512=")
    assert want_repr_digest("sha-256=9, sha-512=2", both).startswith("sha-256=")


def test_repr_digest_for_a_stored_object_leaves_the_origins_own_alone():
    """An origin that sent Repr-Digest answered already: the node adds none of its own."""
    from cachenode.http.digests import repr_digest_for
    amz = [("x-amz-checksum-sha256", b64(SHA256))]
    assert repr_digest_for("sha-256=1", amz, status=200) == f"sha-256=:{b64(SHA256)}:"
    assert repr_digest_for("sha-256=1", amz + [("Repr-Digest", "sha-256=:x:")], status=200) is None
    assert repr_digest_for(None, amz, status=200) is None
    assert repr_digest_for("sha-256=1", amz, status=404) is None
