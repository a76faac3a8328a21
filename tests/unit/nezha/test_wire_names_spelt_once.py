"""Every header and internal path of the node-to-node protocol is spelt once, in nezha/wire.py.

A part that spells one literally can drift from the node that reads it
(a renamed header breaks a relay silently); the shared base and the
controller and webhook use the constants. Comments and prose may name them.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WIRE_NAME = re.compile(r"x-nezha-|/_nezha/", re.IGNORECASE)


def _literal_wire_names(path: Path) -> list[str]:
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        # A name alone in a string; prose (a docstring, a message) may mention one.
        if tok.type == tokenize.STRING and WIRE_NAME.search(tok.string) and not re.search(r"\s", tok.string):
            found.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {tok.string}")
    return found


def test_the_base_controller_and_webhook_spell_no_wire_name_but_in_wire_py():
    files = [p for part in ("nezha", "controller", "webhook") for p in (ROOT / part).rglob("*.py")
             if p != ROOT / "nezha" / "wire.py"]
    assert files
    assert [hit for p in files for hit in _literal_wire_names(p)] == []
