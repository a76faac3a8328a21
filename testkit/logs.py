"""Reading the structured log a running process is writing (one JSON event per line).

A process writes its log while a test reads it, so the last line may be half
written: a reader that parses it fails on a `JSONDecodeError` that says
nothing of what the test checks (it did, once in a full run). Only whole
lines are read here, and a line that is not a JSON object (a traceback, a
library's plain print) is passed over.
"""

from __future__ import annotations

import json
from pathlib import Path


def log_events(path: Path, name: str | None = None) -> list[dict]:
    """The events `path` holds so far, in order; only those called `name` when it is given."""
    text = path.read_text(errors="replace")
    found = []
    for line in text[:text.rfind("\n") + 1].splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and (name is None or event.get("event") == name):
            found.append(event)
    return found
