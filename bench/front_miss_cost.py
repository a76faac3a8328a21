#!/usr/bin/env python3
"""What a cold small fill's client side costs in Python: from a request's
bytes to the miss the fast path leads, and that miss's answer head, this
checkout against a reference checkout, in the same run.

A run of bench/small_fills_ab.py measures the whole node, whose CPU per fill
moves with the box's load by more than this part of it weighs, and
cProfile inflates its many small calls. This times the part alone, on a
node built as `nezha cache` builds it (one origin, an empty opened store,
no peers): each fill is a new path's request head (`GET /d/N/M.bin`, Host
only, as small_files.py's wrk script sends), given to a fast path's
`data_received` (front/fastpath.py) and followed until `FastMisses.take`
has led its flight (`request`); and the head of a miss's answer
(front/fast_misses.py `miss_head`) of a new stored object per fill, its
fields as nginx sends them for a static file (`head`). The flight itself is
not run: each led flight is aborted after its batch, untimed.

Each checkout runs in a child process of its own (the reference is `git
archive REF`, unpacked in a temporary folder, or --reference-tree DIR),
the children in turn, the order reversed every other round. A child reports
the minimum over `--repeats` batches of 2,000 fills, so a batch that other
work on the box slowed does not count. Both checkouts must lead the same
misses and make the same heads: the script stops if they differ.

    python bench/front_miss_cost.py [--reference main | --reference-tree DIR] [--rounds 4] [--repeats 20]

Prints microseconds per fill of each checkout and, last,
`ratios: request=... head=...` (this checkout's time over the reference's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HOST = "images.bench"
# The fields a node keeps of nginx's answer for a static file (bench/judge_cost.py's head, less
# Connection and Content-Length), per file: its own Last-Modified and ETag.
FIELDS = [("Server", "nginx/1.22.1"), ("Date", "Sun, 29 Nov 2026 03:20:11 GMT"),
          ("Content-Type", "application/octet-stream"), ("Last-Modified", "Sun, 29 Nov 2026 02:58:40 GMT"),
          ("ETag", '"6a6b2d40-%x"'), ("Accept-Ranges", "bytes")]
BATCH = 2000


async def child(repeats: int, work: Path) -> None:
    """Time the checkout first on sys.path (PYTHONPATH); one JSON line out."""
    from cachenode.app import build_node
    from cachenode.front.connections import Gate
    from cachenode.front.fast_misses import miss_head
    from cachenode.front.fastpath import FastPath
    from cachenode.store.objects import Meta
    from nezha.config import CacheSettings, Origin
    from nezha.errors import NezhaError

    settings = CacheSettings(listen="127.0.0.1:0", data_dir=work / "node",
                             origins=[Origin(host=HOST, upstream="http://127.0.0.1:9")])
    node = build_node(settings)
    await node.store.open()
    misses = node.handler.misses
    led: list = []

    class Conn(FastPath):
        def _lead(self, req, miss) -> None:  # the flight is the engine's work, not timed here
            led.append(miss)
            del self._buf[:req.size]

    conn = Conn(finder=node.handler.plain, served=node.handler, aiohttp_protocol=None, gate=Gate(1000),
                head_timeout=60.0, misses=misses)
    conn.transport = object()  # type: ignore[assignment]  # only asked whether it is there
    fills = iter(range(10**9))

    def requests() -> list[bytes]:
        return [f"GET /d/{n // 1000}/{n}.bin HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode() for n in
                (next(fills) for _ in range(BATCH))]

    def metas() -> list:
        now = time.time()
        return [Meta(key=f"http://{HOST}/d/0/{n}.bin", url=f"http://{HOST}/d/0/{n}.bin", host=HOST, size=16384,
                     headers=[(k, v % n if "%" in v else v) for k, v in FIELDS], stored_at=now,
                     expires_at=now + 3600) for n in range(BATCH)]

    def request_batch() -> float:
        rs = requests()
        started = time.perf_counter()
        for r in rs:
            conn.data_received(r)
        took = (time.perf_counter() - started) / BATCH * 1e6
        assert len(led) == BATCH and not conn._buf, "every request must be a led miss"
        for miss in led:
            node.engine.flights.abort(miss.flight, NezhaError("not run"))
        led.clear()
        return took

    def head_batch() -> float:
        ms = metas()
        started = time.perf_counter()
        for m in ms:
            miss_head(m, misses.via)
        return (time.perf_counter() - started) / BATCH * 1e6

    request_batch(), head_batch()  # warm: imports, memos
    conn.data_received(b"GET /d/x/%7Ey.bin?a=1 HTTP/1.1\r\nHost: IMAGES.bench:80\r\n\r\n")
    sample = led.pop()
    node.engine.flights.abort(sample.flight, NezhaError("not run"))
    seen = repr((sample.key, sample.url, sample.target, sample.origin, list(sample.headers.items()),
                 list(sample.forwarded.items())))
    print(json.dumps({"request": min(request_batch() for _ in range(repeats)),
                      "head": min(head_batch() for _ in range(repeats)),
                      "miss": seen, "made": miss_head(metas()[7], misses.via).decode("latin-1")}))


def run(tree: Path, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="nezha-front-cost-") as work:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--repeats", str(repeats),
                              "--work", work], env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree,
                             capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{tree}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default="main", help="the git revision to compare against (default main)")
    parser.add_argument("--reference-tree", type=Path, help="a checkout to compare against instead of --reference")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20, help="batches of 2,000 fills per child; the minimum counts")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.repeats, args.work))
        return
    sys.path.insert(0, str(REPO))  # the parent's only: a child imports the checkout on its PYTHONPATH
    from bench.paired import alternated, least, unpack

    with tempfile.TemporaryDirectory(prefix="nezha-front-cost-ref-") as ref:
        tree = args.reference_tree or unpack(args.reference, ref)
        got = alternated({"reference": tree, "this": REPO}, args.rounds, lambda t: run(t, args.repeats))
    for what in ("miss", "made"):
        if len({r[what] for r in got["reference"] + got["this"]}) != 1:
            sys.exit(f"the checkouts differ in the {what}:\n{got['reference'][0][what]}\n{got['this'][0][what]}")
    ratios = least(got, ("request", "head"), reference=str(args.reference_tree or args.reference))
    print("the same misses led and the same heads made by both checkouts")
    print(ratios)


if __name__ == "__main__":
    main()
