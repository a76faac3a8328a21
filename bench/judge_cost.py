#!/usr/bin/env python3
"""What a cold fill's judging of its origin's answer costs in Python: this
checkout against a reference checkout, in the same run.

Every cold fill reads its answer's fields (fill/origin.py `fields_of`),
judges them (fill/judged.py `judge`: RFC 9111 freshness, what is stored,
Vary, the lead's decision) and looks for a published digest
(fill/verify.py `Digests.expected`). A run of bench/small_fills_ab.py
measures the whole node, whose CPU per fill moves with the box's load by
more than this part of it weighs; cProfile's figures for it are inflated by
its many small calls. This times that part alone on one answer: the head
nginx sends for a static file (Server, Date, Content-Type, Content-Length,
Last-Modified, Connection, ETag, Accept-Ranges), each fill on a response of
its own whose fields have not been read yet, as an origin's answer is.

Each checkout runs in a child process of its own (the reference is `git
archive REF`, unpacked in a temporary folder), the children in turn,
the order reversed every other round. A child reports the minimum over
`--repeats` batches of 2,000 fills, so a batch that other work on the box
slowed does not count. Both checkouts must judge the answer the same: the
script stops if their `Judged` or their expected digest differ.

`--distinct-dates`: each answer's Last-Modified a second apart from the
one before (as the files of a dataset are), not one for all: a node
remembers the dates it read lately, and an origin's answers for many
objects bring ever new ones, each read anew.

    python bench/judge_cost.py [--reference main] [--rounds 4] [--repeats 20] [--distinct-dates]

Prints microseconds per fill of each checkout and, last,
`ratios: fill=... judge=...` (this checkout's time over the reference's);
`fill` is the fields read, judged and searched for a digest, `judge` the
judging alone.
"""

from __future__ import annotations

import argparse
import email.utils
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HEAD = [("Server", "nginx/1.22.1"), ("Date", "Sun, 29 Nov 2026 03:20:11 GMT"),
        ("Content-Type", "application/octet-stream"), ("Content-Length", "16384"),
        ("Last-Modified", "Sun, 29 Nov 2026 02:58:40 GMT"), ("Connection", "keep-alive"),
        ("ETag", '"6a6b2d40-4000"'), ("Accept-Ranges", "bytes")]
BATCH = 2000
LAST_MODIFIED = 1_795_921_120  # Sun, 29 Nov 2026 02:58:40 GMT, HEAD's


def child(repeats: int, distinct_dates: bool) -> None:
    """Time the checkout first on sys.path (PYTHONPATH); one JSON line out."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from cachenode.fill.flights import Source
    from cachenode.fill.judged import judge
    from cachenode.fill.origin import InterimResponse, fields_of
    from cachenode.fill.verify import Digests
    from nezha.keys import Target
    from nezha.origins import Origin

    class Counter:  # the mismatch counter's stand-in: no mismatch happens here
        def labels(self, **_labels: str) -> "Counter":
            return self

    origin = Origin(host="origin.test", upstream="http://127.0.0.1:8080")
    source = Source(url="http://127.0.0.1:8080/f/1", what="origin", headers={})
    target = Target("http", "origin.test", "/f/1", "")
    digests = Digests(mismatches=Counter())  # type: ignore[arg-type]
    now = 1_795_836_011.5

    def fits(_length: int) -> bool:
        return True

    def chunking(_vary: object, _authorize: bool) -> tuple[None, int]:
        return None, 16384

    made = itertools.count()

    def response() -> InterimResponse:
        # The node's own response class, its head as aiohttp sets it once read.
        r = object.__new__(InterimResponse)
        head = HEAD
        if distinct_dates:  # a date a second earlier for each answer, none met again in a run
            modified = email.utils.formatdate(LAST_MODIFIED - next(made) % 10_000_000, usegmt=True)
            head = [(n, modified if n == "Last-Modified" else v) for n, v in HEAD]
        r._headers = CIMultiDictProxy(CIMultiDict(head))
        r.status = 200
        r._cache = {}
        return r

    def fill(r: InterimResponse):
        digests.noted(target, r.status, r.headers)
        judged = judge(r, origin=origin, source=source, stale=None, now=now, fits=fits, chunking=chunking)
        return judged, digests.expected(key="k", target=target, status=200, headers=fields_of(r))

    def batch(judge_only: bool) -> float:
        rs = [response() for _ in range(BATCH)]
        started = time.perf_counter()
        if judge_only:
            for r in rs:
                judge(r, origin=origin, source=source, stale=None, now=now, fits=fits, chunking=chunking)
        else:
            for r in rs:
                fill(r)
        return (time.perf_counter() - started) / BATCH * 1e6

    judged, expected = fill(response())
    batch(False)  # warm: imports, caches
    print(json.dumps({"fill": min(batch(False) for _ in range(repeats)),
                      "judge": min(batch(True) for _ in range(repeats)),
                      "judged": repr(judged), "expected": repr(expected)}))


def run(tree: Path, repeats: int, distinct_dates: bool) -> dict:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--repeats", str(repeats),
                          *(["--distinct-dates"] if distinct_dates else [])],
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{tree}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default="main", help="the git revision to compare against (default main)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20, help="batches of 2,000 fills per child; the minimum counts")
    parser.add_argument("--distinct-dates", action="store_true",
                        help="each answer's Last-Modified a second apart, none met twice")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.repeats, args.distinct_dates)
        return
    sys.path.insert(0, str(REPO))  # the parent's only: a child imports the checkout on its PYTHONPATH
    from bench.paired import alternated, least, unpack
    with tempfile.TemporaryDirectory(prefix="nezha-judge-cost-") as ref:
        got = alternated({"reference": unpack(args.reference, ref), "this": REPO}, args.rounds,
                         lambda tree: run(tree, args.repeats, args.distinct_dates))
    if {r["judged"] for r in got["reference"] + got["this"]} != {got["this"][0]["judged"]} or \
            {r["expected"] for r in got["reference"] + got["this"]} != {got["this"][0]["expected"]}:
        sys.exit(f"the checkouts judge the answer differently:\n{got['reference'][0]}\n{got['this'][0]}")
    ratios = least(got, ("fill", "judge"), reference=args.reference)
    print("same Judged and expected digest from both checkouts")
    print(ratios)


if __name__ == "__main__":
    main()
