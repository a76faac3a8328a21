"""Where a node's pins (cachenode/store/pins.py) outlive its process: `pins.json` in its data directory.

    {"version": 1, "pins": {"<cache key>": {"Job/ml/train": null, "Deployment/ml/serve": 1767225600.0}}}

A workload's pins live as long as the workload, and a node may restart
(a rolling update, a crash, an eviction) while it runs: the objects are on
the disk it comes back with, and so must their pins be. The file sits
beside `objects/` and `tmp/`, which the start-up scan owns, and is replaced
whole: written to a temporary name, fsynced, renamed, so a crash leaves
the old pins or the new, never a torn file. A file that cannot be read
(hand-edited, from a newer version) is set aside as `pins.json.unreadable`
and the node starts without pins, saying so: the controller pins again
when it follows the workload anew.

Blocking: the store runs these in its executor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

log = structlog.get_logger("nezha.store")

NAME = "pins.json"
VERSION = 1

Saved = dict[str, dict[str, float | None]]


def save(root: Path, pins: Saved) -> None:
    """Replace `root`/pins.json with `pins`, durably."""
    path = root / NAME
    tmp = root / f".{NAME}.tmp"
    data = json.dumps({"version": VERSION, "pins": pins}, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(root: Path) -> Saved:
    """The pins saved in `root`, or none (no file; an unreadable one is set aside)."""
    path = root / NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(raw)
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}, not {VERSION}")
        pins = doc["pins"]
        out: Saved = {}
        for key, workloads in pins.items():
            out[str(key)] = {str(w): (None if until is None else float(until)) for w, until in workloads.items()}
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        aside = path.with_name(NAME + ".unreadable")
        os.replace(path, aside)
        log.warning("pins_unreadable", path=str(path), set_aside=str(aside), error=f"{type(e).__name__}: {e}")
        return {}
