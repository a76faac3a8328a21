"""A small object's file seals its body and record: any torn or flipped byte is told apart."""

import json
import os

import pytest

from cachenode.store.sealed import MAGIC, TRAILER_SIZE, Unsealed, record_length, seal, unseal

BODY = os.urandom(5000)
RECORD = {"key": "http://h/a.jpg", "size": 5000, "headers": [["ETag", '"x"']]}


def test_a_sealed_file_gives_back_its_body_size_and_record():
    whole = BODY + seal(BODY, RECORD)
    assert unseal(whole) == (len(BODY), RECORD)
    assert record_length(whole[-TRAILER_SIZE:]) == len(whole) - len(BODY) - TRAILER_SIZE


def test_an_empty_body_is_sealed_too():
    assert unseal(seal(b"", RECORD)) == (0, RECORD)


@pytest.mark.parametrize("at", [0, 2499, 4999, 5000, 5010, -TRAILER_SIZE + 1, -1])
def test_one_flipped_byte_anywhere_breaks_the_seal(at):
    whole = bytearray(BODY + seal(BODY, RECORD))
    whole[at] ^= 0x01
    with pytest.raises(Unsealed):
        unseal(bytes(whole))


@pytest.mark.parametrize("keep", [0, 1, TRAILER_SIZE - 1, 4096, 5000 + 20])
def test_a_file_cut_short_is_not_a_whole_object(keep):
    whole = BODY + seal(BODY, RECORD)
    with pytest.raises(Unsealed):
        unseal(whole[:keep])


def test_a_file_whose_last_pages_never_reached_the_disk_is_not_whole():
    whole = bytearray(BODY + seal(BODY, RECORD))
    whole[4096:] = bytes(len(whole) - 4096)  # zeros where the kernel had not written yet
    with pytest.raises(Unsealed):
        unseal(bytes(whole))


def test_a_trailer_naming_a_record_larger_than_the_file_is_refused():
    tail = bytearray(seal(b"", RECORD)[-TRAILER_SIZE:])
    tail[8:12] = (10_000).to_bytes(4, "big")
    with pytest.raises(Unsealed):
        unseal(b"x" * 100 + bytes(tail))


def test_a_file_of_another_format_has_no_trailer():
    with pytest.raises(Unsealed):
        record_length(b"\0" * TRAILER_SIZE)
    assert MAGIC not in b"\0" * TRAILER_SIZE


def test_a_record_is_sealed_as_json_dumps_writes_it_compact():
    """The record's bytes are what every node before this one wrote and reads:
    `json.dumps(record, separators=(",", ":"))`, non-ASCII and lone surrogates
    escaped, an unbounded allowance as `Infinity`."""
    record = {"key": "http://h/\u00e9t\u00e9/\udcff.jpg", "size": 5000, "stale_if_error": float("inf"),
              "stored_at": 1795922793.3171613, "headers": (("ETag", '"x"'), ("X-Note", "caf\u00e9")), "vary": (),
              "hot": False, "status": 200}
    tail = seal(BODY, record)
    raw = tail[:record_length(tail[-TRAILER_SIZE:])]
    assert raw == json.dumps(record, separators=(",", ":")).encode()
    assert unseal(BODY + tail)[1]["stale_if_error"] == float("inf")
