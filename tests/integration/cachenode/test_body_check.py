"""BodyCheck: a growing file's prefix hashed behind its writer, in a thread,
from the page cache (cachenode/fill/verify.py)."""

import asyncio
import hashlib
import os

from cachenode.fill.verify import BodyCheck
from cachenode.http.digests import Algorithm, Expected, Verifier

BODY = os.urandom(3 * 65536 + 123)


def check_of(path, body_digest: bytes, *, step: int = 65536) -> BodyCheck:
    fd = os.open(path, os.O_RDONLY)
    try:
        return BodyCheck(Verifier(Expected(Algorithm.SHA256, body_digest, "Repr-Digest")), fd=fd, step=step)
    finally:
        os.close(fd)  # the check keeps a descriptor of its own


async def grow(path, check: BodyCheck, body: bytes, piece: int = 50_000) -> None:
    with open(path, "r+b", buffering=0) as f:
        for i in range(0, len(body), piece):
            f.write(body[i:i + piece])
            check.grew(i + len(body[i:i + piece]))
            await asyncio.sleep(0.01)  # the writer goes on; a stretch is hashed meanwhile


async def test_the_prefix_is_hashed_while_the_file_grows_and_the_right_bytes_match(tmp_path):
    path = tmp_path / "fill.tmp"
    path.touch()
    check = check_of(path, hashlib.sha256(BODY).digest())
    await grow(path, check, BODY)
    assert check._hashed >= 2 * 65536, "nothing was hashed before the end"
    assert await check.finish(len(BODY)) is None
    assert check.verifier.fed == len(BODY)
    check.close()


async def test_one_changed_byte_is_a_mismatch_naming_both_digests(tmp_path):
    path = tmp_path / "fill.tmp"
    path.touch()
    wrong = BODY[:70_000] + bytes([BODY[70_000] ^ 1]) + BODY[70_001:]
    check = check_of(path, hashlib.sha256(BODY).digest())
    await grow(path, check, wrong)
    mismatch = await check.finish(len(wrong))
    assert mismatch is not None and mismatch.length == len(wrong)
    assert mismatch.got.startswith("sha256:") and mismatch.got != mismatch.expected.shown()
    check.close()


async def test_closing_during_a_stretch_closes_its_descriptor_once_the_stretch_is_done(tmp_path):
    path = tmp_path / "fill.tmp"
    path.write_bytes(BODY)
    check = check_of(path, hashlib.sha256(BODY).digest(), step=1)
    check.grew(len(BODY))
    job, fd = check._job, check._fd
    assert job is not None
    check.close()
    await asyncio.wait([job])
    await asyncio.sleep(0)  # its done-callback ran
    assert check._fd == -1
    try:
        os.fstat(fd)
    except OSError:
        pass
    else:
        # The number may have been reused by another open since: it is not ours any more.
        assert os.readlink(f"/proc/self/fd/{fd}") != str(path)


async def test_a_stretch_that_cannot_be_hashed_fails_the_check_and_is_never_called_a_mismatch(tmp_path):
    """A hash that broke halfway leaves the verifier holding part of a stretch: unchecked, not wrong."""
    import pytest
    from nezha.errors import FillAborted

    path = tmp_path / "fill.tmp"
    path.write_bytes(BODY[:1000])  # shorter than the stretch asked for: the mapping fails
    check = check_of(path, hashlib.sha256(BODY).digest(), step=1)
    check.grew(len(BODY))
    await asyncio.wait([check._job])
    with pytest.raises(FillAborted, match="hashing the body for its Repr-Digest failed"):
        await check.finish(len(BODY))
    check.close()
