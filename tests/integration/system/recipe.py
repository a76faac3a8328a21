"""A recipe page (docs/recipes/*.md) as its whole-system test follows it.

The page is the test's script: what the user types (the chart's values,
a Secret, a Job, the commands that check it) is read from the page's
fenced code blocks, so the page cannot say one thing while the test does
another. A block the test uses carries `recipe=NAME` in its info string
(```` ```yaml recipe=values ````); renderers use only the first word, the
language, so the reader sees an ordinary block.

Two things are not the page's, and each is done in one named place here:
where the cloud is (`stand_in`: the origin's upstream becomes the local
stand-in's address, since nothing leaves this machine), and the secrets a
user pastes (`fill`: the page's placeholders become the test's keys).
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

import yaml
from markdown_it import MarkdownIt

RECIPES = Path(__file__).resolve().parents[3] / "docs" / "recipes"


def blocks(page: Path) -> dict[str, str]:
    """The page's fenced blocks marked `recipe=NAME`, by NAME. A name used twice is an error: the test
    would follow one and the reader might copy the other."""
    out: dict[str, str] = {}
    for token in MarkdownIt("commonmark").parse(page.read_text()):
        if token.type != "fence":
            continue
        for word in token.info.split()[1:]:
            if word.startswith("recipe="):
                name = word.split("=", 1)[1]
                assert name not in out, f"{page.name}: two blocks marked recipe={name}"
                out[name] = token.content
    return out


def stand_in(values: dict, where: dict[str, str]) -> dict:
    """The chart values with each named origin fetched from its local stand-in instead of the cloud.

    The page's entry must fetch the host itself (`upstream: https://<host>`), as a user's does; the stand-in
    speaks plain HTTP on loopback, so both the upstream and the TLS clients' upstream (`tlsUpstream`) name
    it. Nothing else of the values changes."""
    out = copy.deepcopy(values)
    entries = {o["host"]: o for o in out["origins"]}
    for host, url in where.items():
        entry = entries[host]
        assert entry["upstream"] == f"https://{host}", f"{host}: the page's upstream is {entry['upstream']}"
        assert "tlsUpstream" not in entry, f"{host}: the page sets tlsUpstream itself"
        entry["upstream"] = entry["tlsUpstream"] = url
    return out


def fill(text: str, values: dict[str, str]) -> str:
    """`text` with each placeholder replaced; every placeholder must be on the page."""
    for placeholder, value in values.items():
        assert placeholder in text, f"{placeholder} is not in {text!r}"
        text = text.replace(placeholder, value)
    return text


def commands(block: str) -> list[list[str]]:
    """A shell block's commands (one a line, `\\` continuing one), each split as sh would split it;
    comments and blank lines are left out."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def values_of(block: str) -> dict:
    return yaml.safe_load(block)
