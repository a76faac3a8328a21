"""A relayed body's check gives the digest of the bytes fed, in the order
fed, however they are split and whichever way they are hashed (on the loop,
or in batches in a thread behind the relay)."""

from __future__ import annotations

import base64
import hashlib
import random

import pytest
from awscrt import checksums

from cachenode.fill import streamed_digest as relay_digest
from cachenode.fill.streamed_digest import StreamedDigest
from cachenode.http.digests import Verifier, expectations

BODY = random.Random(37).randbytes(relay_digest.MOST + 3 * relay_digest.STEP + 12345)  # past the bound, twice


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


FIELDS = {"sha256": {"x-amz-checksum-sha256": b64(hashlib.sha256(BODY).digest())},
          "crc64nvme": {"x-amz-checksum-crc64nvme": b64(checksums.crc64nvme(BODY).to_bytes(8, "big"))}}


def check_of(kind: str) -> StreamedDigest:
    expected = expectations(FIELDS[kind], status=200).cheapest()
    assert expected is not None
    return StreamedDigest(Verifier(expected))


def pieces(body: bytes, seed: int) -> list[bytes]:
    """`body` cut at random places, from 1 byte to 600 KiB."""
    rng, out, at = random.Random(seed), [], 0
    while at < len(body):
        n = rng.choice((1, 17, 4096, 65536, 262144, 600 * 1024))
        out.append(body[at:at + n])
        at += n
    return out


@pytest.mark.parametrize("kind", list(FIELDS))
@pytest.mark.parametrize("seed", [1, 2])
async def test_the_right_bytes_in_any_pieces_match(kind, seed):
    check = check_of(kind)
    for piece in pieces(BODY, seed):
        await check.feed(piece)
    assert await check.mismatch() is None


@pytest.mark.parametrize("kind", list(FIELDS))
async def test_one_bit_off_anywhere_is_a_mismatch_naming_both_digests_and_the_length(kind):
    for at in (0, relay_digest.STEP + 5, len(BODY) - 1):
        wrong = BODY[:at] + bytes([BODY[at] ^ 1]) + BODY[at + 1:]
        check = check_of(kind)
        for piece in pieces(wrong, at):
            await check.feed(piece)
        mismatch = await check.mismatch()
        assert mismatch is not None and mismatch.length == len(BODY)
        assert mismatch.expected.field == f"x-amz-checksum-{kind}"

