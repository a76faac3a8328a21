"""The docs describe what ships today: no "being built", no "next step", no "not yet", and no "issue N".

A guide written while a feature was on its way tends to keep saying so after
it lands ("Chunks (being built while this was written)", "several worker
processes, the design brief's next step", "**Not yet.** ..."), and a reader
then sizes a cluster or files a bug against a state that is gone. So every
sentence of prose in docs/*.md, README.md, helm/nezha/README.md and
bench/README.md that speaks of the product's own development fails this
test, wherever it is, unless it sits in a plan section.

A plan section is the one way to write down a real future plan: a heading
whose text begins with "Not built" (`## Not built`, `### Not built: hot
copies of chunks`), and everything under it down to the next heading of the
same or a higher level. What it lists is missing today, so it says what is
missing and what happens instead, and nothing outside it speaks of plans.

What counts as speaking of the product's development is the vocabulary in
PLAN_WORDS: "being built", "next step", a sentence or heading that is
"Not yet", "cannot yet" / "does not yet" / "is not yet", "not yet
implemented", "does not say yet", "nothing uses it yet", "will be added /
built / supported", "a later issue", "planned", "for now", "in progress"
said of a design. A "yet" or "will be" about what happens at run time (a
chunk "not stored yet", an object that "will be fetched from the origin
again") is no plan and passes: the checks of the checker below say which is
which.

"issue N" is cited nowhere in this prose: the reader of the docs has no
issue tracker, so a guide says what the issue decided instead. Code blocks
and code spans are not prose and are not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "helm" / "nezha" / "README.md",
                                                ROOT / "bench" / "README.md"]

PLAN_SECTION = re.compile(r"^not built\b", re.IGNORECASE)
_NEG = r"(?:cannot|can ?not|can't|does not|doesn't|do not|don't|is not|isn't|are not|aren't|will not|won't)"
PLAN_WORDS = [re.compile(p, re.IGNORECASE) for p in (
    r"\bbeing built\b", r"\bto be built\b", r"\bnot yet built\b",
    r"\bnext steps?\b",
    r"(?:^|[.!?:]\s+)not yet\b",  # "Not yet." as a sentence or a heading of its own
    rf"\b{_NEG}\s+yet\b",  # "cannot yet stream"
    r"\bnot yet (?:implemented|supported|possible|available|done|written|decided)\b",
    r"\b(?:implemented|supported|decided) yet\b",
    r"\b(?:say|says|use|uses|decide|decides|support|supports)(?: it| this| that| so)? yet\b",
    r"\bwill be (?:added|built|supported|implemented|shipped|released|fixed|possible|available)\b",
    r"\b(?:a|the) (?:later|future|next) (?:issue|part|round|release|version)\b",
    r"\b(?:planned|upcoming|coming soon|roadmap|work in progress|TODO|unimplemented)\b",
    r"\bfor now\b",
    r"\b(?:design|work) in progress\b",
    r"\bwhile this was written\b",
)]
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


@dataclass(frozen=True)
class Prose:
    page: Path
    line: int  # 1-based, the first line of the block the text is in
    text: str  # what a reader reads: code spans left out, breaks as spaces
    in_plan: bool  # under a "Not built" heading


def prose_of(page: Path, markdown: str | None = None) -> Iterator[Prose]:
    """Every heading, paragraph, list item and table cell of `page`, as text, code left out."""
    tokens = MarkdownIt("commonmark").enable("table").parse(page.read_text() if markdown is None else markdown)
    plan_level: int | None = None  # the level of the "Not built" heading we are under
    heading_level: int | None = None
    for token in tokens:
        if token.type == "heading_open":
            heading_level = int(token.tag[1])
            continue
        if token.type != "inline":
            continue
        text = " ".join(c.content if c.type == "text" else " " for c in token.children or ()
                        if c.type in ("text", "softbreak", "hardbreak"))
        text = re.sub(r"\s+", " ", text).strip()
        if heading_level is not None:
            if plan_level is not None and heading_level <= plan_level:
                plan_level = None
            if PLAN_SECTION.match(text):
                plan_level = heading_level
        yield Prose(page, (token.map[0] + 1) if token.map else 0, text, plan_level is not None)
        heading_level = None


def plan_words_in(text: str) -> list[str]:
    return [m.group(0).strip(" .!?:") for p in PLAN_WORDS for m in p.finditer(text)]


def where(p: Prose) -> str:
    return f"{p.page.relative_to(ROOT)}:{p.line}"


# -- the checker's own parts -----------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "Chunks (part 2, being built while this was written): an object at least 1 GiB",
    "several worker processes per node, the design brief's next step, would lift it",
    "Not yet. Over TLS, everything after the first request is bridged to the primary.",
    "Not yet",
    "a reading node cannot yet stream a chunk it is still filling",
    "The design of part 2 does not say yet whether chunk reads count as hot reads",
    "The controller can do it, but nothing uses it yet: today every hand-off is started by the leaving node",
    "Range requests will be supported in a later release.",
    "This is left for a later issue.",
    "The model takes this from the design in progress.",
])
def test_a_statement_of_what_is_still_to_come_is_caught(text):
    assert plan_words_in(text)


@pytest.mark.parametrize("text", [
    "after a peer-miss (the owner's own fill, perhaps not stored yet) the next read relays",
    "What it held will be fetched from the origin again, never served wrong.",
    "So a follower that has not yet seen the write serves the old copy.",
    "sidecar RSS: 66.9 MiB idle (ready, no request yet)",
    "later requests join it as any request joins a fill in progress",
    "A server or Redis that does not answer yet is retried with backoff.",
    "a pod without an IP yet is left out",
])
def test_a_yet_or_will_be_about_run_time_is_not(text):
    assert plan_words_in(text) == []


def test_a_plan_is_allowed_under_a_not_built_heading_and_nowhere_else(tmp_path):
    page = tmp_path / "page.md"
    found = list(prose_of(page, "# Guide\n\nChunks ship.\n\n## Not built: chunk hot copies\n\n"
                                "- Hot copies of chunks are being built.\n\n### Detail\n\nStill the plan.\n\n"
                                "## Limits\n\nThe next step is a plan out of place.\n"))
    assert [(p.text, p.in_plan) for p in found] == [
        ("Guide", False), ("Chunks ship.", False), ("Not built: chunk hot copies", True),
        ("Hot copies of chunks are being built.", True), ("Detail", True), ("Still the plan.", True),
        ("Limits", False), ("The next step is a plan out of place.", False)]


def test_code_is_not_prose(tmp_path):
    page = tmp_path / "page.md"
    found = list(prose_of(page, "Run `nezha up` (see issue 3 in `git log`).\n\n```\n# issue 4: not yet\n```\n"))
    assert [p.text for p in found] == ["Run (see issue 3 in )."]


# -- the docs ---------------------------------------------------------------------------------------------

def test_the_docs_speak_of_what_ships_and_keep_plans_under_not_built():
    found = [f"{where(p)}: {', '.join(repr(w) for w in words)} in: {p.text[:160]}"
             for page in PAGES for p in prose_of(page) if not p.in_plan and (words := plan_words_in(p.text))]
    assert not found, ("prose that speaks of the product's development outside a 'Not built' section "
                       "(say what ships, or move the plan under a 'Not built' heading):\n" + "\n".join(found))


def test_the_docs_say_what_an_issue_decided_instead_of_citing_it():
    found = [f"{where(p)}: {m.group(0)!r} in: {p.text[:160]}"
             for page in PAGES for p in prose_of(page) for m in ISSUE.finditer(p.text)]
    assert not found, "the docs' reader has no issue tracker:\n" + "\n".join(found)
