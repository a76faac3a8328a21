"""A stored object's record (its `Meta`'s fields) and the JSON its sealed file holds.

Apart from the file format (cachenode/store/sealed.py, which seals any
record) because this knows a `Meta`: `record_of` is the record every writer
of a record sends or stores, and `record_json` its JSON for a small object's
seal, written without the dict for the record a fill stores. One per small
object stored: the dict and `json`'s C encoder cost 6.3 us for a fill's
record (the encoder makes a string per key and value and gathers them in a
list, then joins them), this 3.9 (timeit, the least of 15 runs of 20000).

`record_json` gives exactly `json.dumps(record_of(meta), separators=(",", ":"))`,
the bytes every node before it wrote and reads: its fast path takes the
fields as a `Meta` built by its constructor holds them (exact str, int,
float and bool; headers a tuple of 2-tuples of str) and spells them as the
C encoder does; anything else (an int subclass, a header value that is not
a str, a field added to `Meta`) goes to the encoder itself.
"""

from __future__ import annotations

from dataclasses import fields
from json.encoder import encode_basestring_ascii

from cachenode.store.objects import Meta
from cachenode.store.sealed import encode_record

_FIELDS = tuple(f.name for f in fields(Meta))
# The fields `_plain` spells, in its order: when `Meta` gains or reorders one, every record takes the encoder.
_PLAIN_FIELDS = ("key", "url", "host", "size", "headers", "stored_at", "expires_at", "stale_if_error", "data",
                 "age", "stale_while_revalidate", "status", "vary", "variant", "authorize", "hot", "extra",
                 "chunk_size", "length", "blocks")
_SPELLED = _FIELDS == _PLAIN_FIELDS
_INTS = (int, int, int, int)
_FLAGS = (bool, bool, bool)


def record_of(meta: Meta) -> dict:
    """`meta` as its file's record: `asdict` without its deep copy (every value is immutable)."""
    return {name: getattr(meta, name) for name in _FIELDS}


def record_json(meta: Meta) -> bytes:
    """`json.dumps(record_of(meta), separators=(",", ":")).encode()`, the record a sealed file holds."""
    if _SPELLED:
        try:
            return _plain(meta).encode()
        except (TypeError, ValueError):
            pass  # a value `_plain` does not spell: the encoder writes it, or raises what it raises for it
    return encode_record(record_of(meta))


def _number(x: object) -> str:
    """A float or int as the C encoder spells it: `float.__repr__`, or `Infinity`, `-Infinity`, `NaN`."""
    if type(x) is float:
        if x - x == 0.0:  # finite
            return float.__repr__(x)
        return "NaN" if x != x else "Infinity" if x > 0 else "-Infinity"
    if type(x) is int:
        return int.__repr__(x)
    raise TypeError(f"{type(x).__name__} is not a plain number")


def _plain(m: Meta) -> str:
    """The record's JSON for the types a `Meta` usually holds; TypeError or ValueError for any other.
    `encode_basestring_ascii` is what the encoder calls for every str, and raises TypeError for anything else."""
    s = encode_basestring_ascii
    headers, vary = m.headers, m.vary
    if (type(m.size), type(m.status), type(m.chunk_size), type(m.length)) != _INTS \
            or (type(m.authorize), type(m.hot), type(m.extra)) != _FLAGS \
            or type(headers) is not tuple or type(vary) is not tuple:
        raise TypeError("a field of another type than a fill's")
    for pair in headers:
        if type(pair) is not tuple:  # a list, or a str of two letters, is spelled another way
            raise TypeError(f"a header pair of type {type(pair).__name__}")
    pairs = ",".join([f"[{s(name)},{s(value)}]" for name, value in headers])  # ValueError: not a pair
    varies = ",".join([s(name) for name in vary])
    return (f'{{"key":{s(m.key)},"url":{s(m.url)},"host":{s(m.host)},"size":{m.size},"headers":[{pairs}],'
            f'"stored_at":{_number(m.stored_at)},"expires_at":{_number(m.expires_at)},'
            f'"stale_if_error":{_number(m.stale_if_error)},"data":{s(m.data)},"age":{_number(m.age)},'
            f'"stale_while_revalidate":{_number(m.stale_while_revalidate)},"status":{m.status},'
            f'"vary":[{varies}],"variant":{s(m.variant)},"authorize":{"true" if m.authorize else "false"},'
            f'"hot":{"true" if m.hot else "false"},"extra":{"true" if m.extra else "false"},'
            f'"chunk_size":{m.chunk_size},"length":{m.length},"blocks":{s(m.blocks)}}}')
