"""`nezha verify`: a stopped node's store checked object by object (issue 37 item 3).

Every object the node would serve is read whole: a small object's sealed
file against its CRC32C (cachenode/store/sealed.py), a large object's data
file against its length and the node's own block checksums
(cachenode/store/blocks.py). Nothing is changed: the node, when it starts,
drops torn files itself, and a corrupt large object is removed the first
time a read with `--verify-reads` or the scrub finds it. This is for the
operator who wants to know before then (after a disk error, a restore from
a backup) and for a node that may not start at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cachenode.store import small
from cachenode.store.layout import read_meta
from cachenode.store.scrub import check_file


@dataclass(frozen=True)
class Bad:
    """One object that is not what its record says."""

    path: Path  # its data file (a small object's one file)
    key: str  # "" when its record cannot be read
    why: str


@dataclass
class Report:
    checked: int = 0  # objects read whole
    unchecked: int = 0  # large objects stored before block checksums: length checked only
    bytes: int = 0


def bad_objects(data_dir: Path, report: Report | None = None) -> Iterator[Bad]:
    """Each bad object under `data_dir`'s objects/ folder, in the order found."""
    report = report if report is not None else Report()
    for sub in sorted((data_dir / "objects").iterdir()):
        if not sub.is_dir():
            continue
        for path in sorted(sub.iterdir()):
            if path.suffix == small.SUFFIX:
                report.checked += 1
                meta = small.read_sealed(path)
                if meta is None:
                    yield Bad(path, "", "its seal does not hold: torn or damaged")
                else:
                    report.bytes += meta.size
            elif path.suffix == ".meta":
                meta = read_meta(path)
                if meta is None:
                    yield Bad(path, "", "its record cannot be read")
                    continue
                report.checked += 1
                report.bytes += meta.size
                if not meta.blocks and not meta.chunk_size:
                    report.unchecked += 1
                data = sub / meta.data
                if not data.exists():
                    yield Bad(data, meta.key, "its data file is missing")
                    continue
                why = check_file(str(data), meta)
                if why is not None:
                    yield Bad(data, meta.key, why)
