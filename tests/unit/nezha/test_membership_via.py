"""`membership_changed`'s `via` (nezha/index/membership.py `VIA`): one list of
the reads that bring a ring, which the code, the check and the docs share."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from nezha.index.membership import VIA, MembershipWatch
from nezha.ring import Membership

ROOT = Path(__file__).resolve().parents[3]


def test_a_via_that_is_none_of_the_named_reads_is_refused_by_name():
    watch = MembershipWatch(None, refresh_interval=1.0, backoff_max=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="via='pubished' is none of published, subscribed"):
        membership = Membership(epoch=1, nodes={"a": "127.0.0.1:1"}, weights={"a": 1})
        watch.adopt(membership, via="pubished")  # type: ignore[arg-type]
    assert watch.membership is None, "nothing adopted"


def test_every_via_the_code_passes_is_one_of_the_named_reads_and_each_is_passed():
    passed = set()
    for path in [*ROOT.glob("nezha/**/*.py"), *ROOT.glob("cachenode/**/*.py"), *ROOT.glob("controller/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("adopt", "refresh"):
                passed |= {k.value.value for k in node.keywords
                           if k.arg == "via" and isinstance(k.value, ast.Constant)}
    assert passed == set(VIA)


def test_the_schema_doc_names_exactly_the_reads_a_via_can_name():
    text = (ROOT / "docs" / "redis-schema.md").read_text()
    sentence = text[text.index("`membership_changed` log line whose `via`"):]
    sentence = sentence[:sentence.index("\n\n")]
    assert set(re.findall(r"`([a-z_]+)` \(", sentence)) == set(VIA)
