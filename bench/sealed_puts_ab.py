#!/usr/bin/env python3
"""A small object's store write alone (`Store.put_sealed`), two or more checkouts paired.

`bench/small_fills_ab.py` measures a whole cold fill through a node, where
a change of a few percent drowns in the shared box's load (its pairs move by
a hundred microseconds between rounds of the same node). This measures only
the store's part: in a fresh process per checkout and round, a `Store` on
`--work` (/dev/shm) takes N bodies of 16 KiB through `put_sealed`, as a
fill stored at once does (room, admission, the file, the index), and the
process's own CPU time (user + system, `time.process_time`) per put is printed. The
checkouts run in turn, the order reversed every other round, and each
round says which used less CPU than the first tree's.

    python bench/sealed_puts_ab.py --tree main=/tmp/main-copy --tree new=. --rounds 12

A tree is NAME=DIR: the checkout whose `cachenode` the round's process imports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Run in the tree's own process: N puts, then one line, "<us per put>".
CHILD = r"""
import asyncio, os, sys, time
from cachenode.store.disk import Store

async def main(root, n):
    store = Store(root, sync_interval=3600)
    await store.open(background=False)
    body = os.urandom(16 * 1024)
    headers = (("Content-Type", "image/jpeg"), ("ETag", '"5f3c-4000"'), ("Cache-Control", "max-age=3600"),
               ("Last-Modified", "Sat, 28 Nov 2026 11:00:00 GMT"))
    keys = [f"http://images.bench/train/n{i:08d}.JPEG" for i in range(n)]
    now = time.time()
    before = time.process_time()
    for key in keys:
        store.put_sealed(body, key=key, url=key, host="images.bench", headers=headers, stored_at=now,
                         expires_at=now + 3600)
    cpu = time.process_time() - before
    print(f"{cpu / n * 1e6:.2f}")
    await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def one(tree: Path, root: Path, n: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(n)], env=env, cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    shutil.rmtree(root, ignore_errors=True)
    return float(out.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, the first the reference")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--puts", type=int, default=20_000)
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"))
    args = ap.parse_args()
    trees = [(name, Path(d).resolve()) for name, d in (t.split("=", 1) for t in args.tree)]
    work = Path(tempfile.mkdtemp(prefix="nezha-puts-ab-", dir=args.work))
    got: dict[str, list[float]] = {name: [] for name, _ in trees}
    wins = {name: 0 for name, _ in trees}
    try:
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            this = {}
            for name, tree in order:
                this[name] = one(tree, work / name, args.puts)
                got[name].append(this[name])
                print(f"  round {r} {name}: {this[name]:.1f} CPU us per put", flush=True)
            ref = trees[0][0]
            for name, _ in trees[1:]:
                wins[name] += this[name] < this[ref]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, _ in trees:
        line = f"{name}: {statistics.median(got[name]):.1f} us per put (median; {min(got[name]):.1f} to {max(got[name]):.1f})"
        if name != trees[0][0]:
            line += f", less CPU than {trees[0][0]} in {wins[name]} of {args.rounds} rounds"
        print(line)


if __name__ == "__main__":
    main()
