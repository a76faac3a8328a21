"""A small object's record is written as the JSON encoder writes it, byte for byte, whatever its fields hold."""

import json
import math
from dataclasses import replace
from enum import IntEnum

import pytest

from cachenode.store.objects import Meta
from cachenode.store.record_json import _plain, record_json, record_of
from cachenode.store.sealed import seal, seal_encoded

NOW = 1795922793.3171613
BASE = Meta(key="http://images.example/train/n01.JPEG", url="http://images.example/train/n01.JPEG",
            host="images.example", size=16384,
            headers=(("Content-Type", "image/jpeg"), ("ETag", '"5f3c-4000"'), ("Cache-Control", "max-age=3600")),
            stored_at=NOW, expires_at=NOW + 3600, data="ab" * 32 + ".0123456789ab.obj")


class Status(IntEnum):
    OK = 200


def dumps(meta: Meta) -> bytes:
    return json.dumps(record_of(meta), separators=(",", ":")).encode()


# What a fill stores: the fast path spells each of these itself.
PLAIN = [
    BASE,
    replace(BASE, headers=()),
    replace(BASE, key="http://h/\u00e9t\u00e9/\udcff \u2603.jpg", url="http://h/x?a=\"b\"\\c\n\t\x01",
            headers=(("X-Note", "caf\u00e9 \U0001f600"), ("Link", '<http://h/a>; rel="x"'))),
    replace(BASE, stale_if_error=math.inf, expires_at=-math.inf, age=math.nan, stale_while_revalidate=1e300),
    replace(BASE, stored_at=0.1 + 0.2, expires_at=1e-7, age=-0.0, stale_if_error=12.5, stale_while_revalidate=5e22),
    replace(BASE, stored_at=NOW.__trunc__(), expires_at=2 ** 70, age=3, stale_if_error=0, stale_while_revalidate=-1),
    replace(BASE, vary=("accept", "accept-encoding"), variant="gzip\nimage/webp", status=404, hot=True,
            extra=True, authorize=True),
    replace(BASE, chunk_size=4 << 20, length=10 ** 12, size=0, blocks="0a1b2c:ffff", data=""),
    replace(BASE, stale_if_error=True),  # a record of before: Meta reads a yes as an unbounded allowance
]

# Fields the fast path leaves to the encoder: what a Meta rarely holds, spelled another way.
ODD = [
    replace(BASE, status=Status.OK),  # an int subclass: `int.__repr__` either way, but not the fast path's
    replace(BASE, status=True, size=False),  # a bool where an int belongs
    replace(BASE, headers={"ETag": 5, "X-None": None, "X-List": ["a", 1]}),  # a dict's values as they came
    replace(BASE, authorize=1, hot=0),  # an int where a flag belongs
    replace(BASE, age=None, stale_while_revalidate="3"),
    replace(BASE, vary=["accept", 7]),
]


@pytest.mark.parametrize("meta", PLAIN + ODD)
def test_a_record_is_the_bytes_json_dumps_gives(meta):
    """Every record is written as `json.dumps(record, separators=(",", ":"))` writes it."""
    assert record_json(meta) == dumps(meta)


@pytest.mark.parametrize("meta", PLAIN + ODD)
def test_a_seal_of_the_record_json_is_the_seal_of_the_record(meta):
    """What follows a body in its file is the same whether the record is encoded here or by `seal`."""
    body = bytes(range(256)) * 3
    assert seal_encoded(body, record_json(meta)) == seal(body, record_of(meta))


@pytest.mark.parametrize("meta", PLAIN)
def test_the_fast_path_spells_what_a_fill_stores_itself(meta):
    """A record of the usual types is written by the fast path, not handed to the encoder."""
    assert _plain(meta).encode() == dumps(meta)


@pytest.mark.parametrize("meta", ODD)
def test_the_fast_path_declines_what_it_would_spell_otherwise(meta):
    """A field the fast path does not spell as the encoder does is the encoder's."""
    with pytest.raises(TypeError):
        _plain(meta)


def test_headers_that_are_not_pairs_of_a_tuple_go_to_the_encoder():
    """A record unpickled past `Meta`'s constructor (a list, or a string of two letters, as a pair) is the encoder's."""
    for odd in ((["ETag", '"x"'],), ("ab",), (("a", "b", "c"),)):
        meta = replace(BASE)
        object.__setattr__(meta, "headers", odd)
        assert record_json(meta) == dumps(meta)


def test_a_record_the_encoder_cannot_write_raises_what_it_raises():
    """What the encoder refuses (a value JSON has no spelling for) fails as it did."""
    meta = replace(BASE, age=object())
    with pytest.raises(TypeError, match="not JSON serializable"):
        record_json(meta)
