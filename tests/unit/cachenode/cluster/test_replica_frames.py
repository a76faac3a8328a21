"""The records of a batched replica push: each found and checked alone (cachenode/cluster/replica_frames.py)."""

from __future__ import annotations

import pytest

from cachenode.cluster.replica_frames import (HEAD_SIZE, MAX_BODY, BrokenFrame, Damaged, encode, open_record,
                                              read_head)


def records(stream: bytes) -> list[tuple[dict, bytes] | str]:
    """Each record of `stream` opened, or why it was refused; stops where a head is broken."""
    out: list[tuple[dict, bytes] | str] = []
    at = 0
    while at < len(stream):
        try:
            head = read_head(stream[at:at + HEAD_SIZE])
        except BrokenFrame as e:
            out.append(f"broken: {e}")
            break
        payload = stream[at + HEAD_SIZE:at + HEAD_SIZE + head.payload]
        at += HEAD_SIZE + head.payload
        try:
            meta, body = open_record(head, payload)
            out.append((meta, bytes(body)))
        except Damaged as e:
            out.append(f"damaged: {e}")
    return out


def test_records_come_back_as_they_were_framed():
    sent = [({"key": f"k{i}", "size": i}, bytes([i]) * i * 100) for i in range(4)]
    assert records(b"".join(encode(meta, body) for meta, body in sent)) == sent


@pytest.mark.parametrize("where", ["meta", "body"])
def test_a_flipped_bit_in_one_record_refuses_that_record_alone(where):
    frames = [bytearray(encode({"key": f"k{i}"}, b"x" * 50)) for i in range(3)]
    at = HEAD_SIZE + 2 if where == "meta" else len(frames[1]) - 1
    frames[1][at] ^= 0x04
    got = records(b"".join(frames))
    assert got[0] == ({"key": "k0"}, b"x" * 50) and got[2] == ({"key": "k2"}, b"x" * 50)
    assert isinstance(got[1], str) and got[1].startswith("damaged: CRC32C")


def test_a_damaged_head_stops_the_stream_there():
    frames = [bytearray(encode({"key": f"k{i}"}, b"y" * 10)) for i in range(3)]
    frames[1][6] ^= 0x01  # its meta length: the next record could not be found
    got = records(b"".join(frames))
    assert got[0] == ({"key": "k0"}, b"y" * 10)
    assert len(got) == 2 and got[1].startswith("broken: the head's checksum")


def test_a_head_that_promises_more_than_a_small_object_is_refused():
    import struct

    import google_crc32c

    head = struct.pack(">4sIII", b"NZR1", 10, MAX_BODY + 1, 0)
    with pytest.raises(BrokenFrame, match="beyond"):
        read_head(head + struct.pack(">I", google_crc32c.value(head)))


def test_bytes_that_are_no_record_are_refused():
    with pytest.raises(BrokenFrame):
        read_head(b"GET / HTTP/1.1\r\nHost: x"[:HEAD_SIZE])
    with pytest.raises(BrokenFrame, match="20 bytes"):
        read_head(b"short")
