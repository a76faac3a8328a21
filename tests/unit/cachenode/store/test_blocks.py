"""The node's own block checksum (cachenode/store/blocks.py): a changed byte is
found in its block, a range checks only the blocks it touches, and a copy's
summary tells two lists apart."""

import os

import pytest

from cachenode.store import blocks

BLOCK = 4096
SIZE = 5 * BLOCK + 123  # a short last block


@pytest.fixture
def stored(tmp_path):
    path = tmp_path / "object.data"
    path.write_bytes(os.urandom(SIZE))
    fd = os.open(path, os.O_RDWR)
    yield fd, blocks.compute(fd, SIZE, block=BLOCK)
    os.close(fd)


def test_the_checksum_names_its_kind_block_size_and_one_crc_per_block(stored):
    fd, sums = stored
    block, crcs = blocks.parse(sums)
    assert sums.startswith(f"crc32c/{BLOCK}/") and block == BLOCK and len(crcs) == 6


def test_intact_bytes_pass_whole_and_in_any_range(stored):
    fd, sums = stored
    blocks.check(fd, SIZE, sums)
    for start, length in ((0, 1), (BLOCK - 1, 2), (3 * BLOCK + 7, 100), (SIZE - 1, 1), (0, SIZE)):
        blocks.check(fd, SIZE, sums, start=start, length=length)


@pytest.mark.parametrize("at", [0, BLOCK + 17, SIZE - 1])
def test_a_flipped_byte_is_found_in_its_block_whole_and_by_a_range_that_touches_it(stored, at):
    fd, sums = stored
    byte = os.pread(fd, 1, at)
    os.pwrite(fd, bytes([byte[0] ^ 0x01]), at)
    with pytest.raises(blocks.BadBlocks, match=f"block {at // BLOCK} "):
        blocks.check(fd, SIZE, sums)
    with pytest.raises(blocks.BadBlocks, match=f"block {at // BLOCK} "):
        blocks.check(fd, SIZE, sums, start=at, length=1)  # one byte asked: its whole block is read


def test_a_range_that_does_not_touch_the_flipped_block_passes(stored):
    fd, sums = stored
    os.pwrite(fd, b"\x00" if os.pread(fd, 1, 0) != b"\x00" else b"\x01", 0)
    blocks.check(fd, SIZE, sums, start=2 * BLOCK, length=BLOCK)


def test_a_checksum_for_another_length_is_refused(stored):
    fd, sums = stored
    with pytest.raises(blocks.BadBlocks, match="6 block checksums for"):
        blocks.check(fd, SIZE + BLOCK, sums)


def test_the_summary_tells_lists_apart_and_names_the_count(stored, tmp_path):
    fd, sums = stored
    kind, size, count, _ = blocks.summary(sums).split("/")
    assert (kind, int(size), int(count)) == ("crc32c", BLOCK, 6)
    os.pwrite(fd, bytes([os.pread(fd, 1, 5)[0] ^ 0x80]), 5)
    assert blocks.summary(blocks.compute(fd, SIZE, block=BLOCK)) != blocks.summary(sums)


def test_another_format_is_refused():
    with pytest.raises(blocks.BadBlocks):
        blocks.parse("sha256/4096/00")
