"""The sealed files of one `objects/<2 hex>` folder, as one listing found
them (pure): how a lookup before the start-up scan reached the folder finds
a key's small objects without listing the folder again
(cachenode/store/loading.py).

Why a listing kept: a small object's file is named `<id>.<nonce>.obj`, the
nonce random (cachenode/store/small.py `_data_name`), so a lookup knows its
name only from the folder. A glob of `<id>.*.obj` per lookup lists and
matches the whole folder in Python: 2.6 ms at 3,906 files (a million
objects), on the event loop, for every request until the scan gets there.
Listed once, at the folder's first lookup (3.2 ms at 3,906 files, half of
it `os.listdir`), a lookup is a bisection and an open of each file the
listing names for the key: a miss 11 us whatever the folder holds.

Why in this form: per sealed file two 64-bit integers, the first 64 bits of
its id and its 48-bit nonce, in two arrays sorted by the first (16 bytes a
file, not a Python string of 81 characters and ~130 bytes), kept only until
the scan reaches the folder. A name of another form (none the store writes)
is kept as it is and matched as the glob would match it.

What a listing does not know is not missed: a file written after it is a
commit's, which loaded the key before (from the index it is found from
then on; a lookup between its rename and its landing in the index misses,
as one a moment earlier would), and no follower leads a fill while the
index loads; a file gone since is not found when opened. Two ids that
share 64 bits only cost an open that finds nothing.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from fnmatch import fnmatchcase
from typing import Iterable

SUFFIX = ".obj"  # a sealed file's, as cachenode/store/small.py `SUFFIX`
_ID, _NONCE = 64, 12  # hex digits: SHA-256 of the slot, 48 random bits
_LENGTH = _ID + 1 + _NONCE + len(SUFFIX)
_PREFIX = 16  # hex digits of the id kept: 64 bits


class SealedListing:
    """The `<id>.<nonce>.obj` names one listing of a folder held."""

    __slots__ = ("_prefixes", "_nonces", "_odd")

    def __init__(self, names: Iterable[str]) -> None:
        sealed = [n for n in names if n.endswith(SUFFIX)]
        # Each name's 64 bits of id and nonce as 32 hex digits: sorted as strings, they are
        # sorted as numbers (fixed width, lowercase), and one fromhex reads them all.
        keys = [n[:_PREFIX] + "0000" + n[_ID + 1:_ID + 1 + _NONCE] for n in sealed
                if len(n) == _LENGTH and n[_ID] == "."]
        keys.sort()
        pairs = _numbers(keys)
        if pairs is not None:
            self._odd = [n for n in sealed if len(n) != _LENGTH or n[_ID] != "."] if len(keys) < len(sealed) else []
        else:  # some name's digits are not lowercase hex: told apart one by one
            keys, self._odd = _split(sealed)
            pairs = _numbers(keys)
        self._prefixes = pairs[0::2]
        self._nonces = pairs[1::2]

    def __len__(self) -> int:
        return len(self._prefixes) + len(self._odd)

    @property
    def nbytes(self) -> int:
        """What its arrays hold (names of another form apart)."""
        return (len(self._prefixes) + len(self._nonces)) * self._prefixes.itemsize

    def names(self, oid: str) -> list[str]:
        """The names a glob of `<oid>.*.obj` would have found in the folder when
        it was listed, and perhaps one that was not there (of an id sharing its
        first 64 bits with `oid`): opened, it is not found."""
        prefixes, nonces = self._prefixes, self._nonces
        prefix = int(oid[:_PREFIX], 16)
        i = bisect_left(prefixes, prefix)
        found = []
        while i < len(prefixes) and prefixes[i] == prefix:
            found.append(f"{oid}.{nonces[i]:0{_NONCE}x}{SUFFIX}")
            i += 1
        if self._odd:
            found += [n for n in self._odd if fnmatchcase(n, f"{oid}.*{SUFFIX}")]
        return found if len(found) < 2 else list(dict.fromkeys(found))


def _numbers(keys: list[str]) -> array | None:
    """The keys' (prefix, nonce) pairs, interleaved; None unless every key is 32 lowercase hex digits."""
    joined = "".join(keys)
    try:
        raw = bytes.fromhex(joined)
    except ValueError:
        return None
    if len(raw) != 16 * len(keys) or joined != joined.lower():  # fromhex passes over whitespace
        return None
    pairs = array("Q")
    pairs.frombytes(raw)
    if sys.byteorder == "little":
        pairs.byteswap()
    return pairs


def _split(sealed: list[str]) -> tuple[list[str], list[str]]:
    """(sorted keys of the names of the form, the other names)."""
    keys, odd = [], []
    for n in sealed:
        key = n[:_PREFIX] + "0000" + n[_ID + 1:_ID + 1 + _NONCE]
        if len(n) == _LENGTH and n[_ID] == "." and _numbers([key]) is not None:
            keys.append(key)
        else:
            odd.append(n)
    keys.sort()
    return keys, odd
