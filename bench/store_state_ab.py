#!/usr/bin/env python3
"""Whether two or more checkouts' stores end in the same state after the same small writes.

A change meant to make `Store.put_sealed` cheaper (bench/sealed_puts_ab.py
measures it) must leave everything it writes as it was: the files' bytes,
the index's rows, the eviction policies, the census, every answer and
every error. This drives each checkout's `Store`, in a fresh process of its
own, through the same seeded run of varied small writes and reads: keys
with non-ASCII and chunk keys, responses that vary, hot and extra copies,
headers as pairs, lists or a dict, expiries and allowances that are
floats, ints, infinite or a yes, a status that is not an int, bodies of 0
to 16 KiB, replacements, lookups, and stores at several capacities (none;
small enough that most writes evict or are refused). `random` is seeded,
so the files' nonces are the same too.

    python bench/store_state_ab.py --tree main=/tmp/main-copy --tree new=.

Prints, per seed and checkout, digests of the answers, of every file's name
and bytes, and of the index (its rows' arrays, usage, evictions, kept and
recent records, variants, chunks, each kind's policy history and order,
the census's buckets), then `same` or the seeds that differ, exiting 1 then.
A tree is NAME=DIR: the checkout whose `cachenode` the process imports.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SEEDS = ((1, 0, 600), (2, 60_000, 900), (3, 200_000, 1500), (4, 20_000, 500))  # (seed, capacity or 0, writes)

# Run in the tree's own process: one line per seed, "<seed> <answers> <files> <index>".
CHILD = r"""
import asyncio, hashlib, json, logging, math, os, random, shutil, sys, tempfile
import structlog
from cachenode.store.disk import Store
from cachenode.store.objects import NotStored
from cachenode.store.small import record_of
from nezha.errors import NezhaError
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))

def index_state(store):
    idx = store.index
    r = idx._rows
    out = {"rows": [bytes(r.digests).hex(), list(r.hashes), list(r.sizes), list(r.nonces), list(r.flags),
                    list(r.last), list(r.prev), list(r.next), list(r._free), list(r.table._rows), r.count],
           "usage": vars(idx.usage), "evictions": dict(idx.evictions), "kept": sorted(idx._kept),
           "recent": list(idx._recent), "varying": {k: sorted(v) for k, v in idx._varying.items()},
           "vary": dict(idx._vary), "chunks": {k: sorted(v) for k, v in idx._chunks.items()},
           "census": [[b.hits, b.misses, b.first_bytes, dict(b.reads)] for b in idx.census._buckets]}
    for kind, p in idx.policies.items():
        h = p._history
        out[kind] = [p._now, p._since_halving, list(p._hit_gaps), list(h.last), bytes(h.counts).hex(),
                     list(h.tags), p._order.head, p._order.tail, len(p._order)]
    return out

async def run(root, seed, capacity, n):
    random.seed(seed)
    rng = random.Random(seed + 1)
    store = Store(root, sync_interval=3600, capacity=capacity, hot_capacity=capacity // 4 if capacity else None,
                  extra=lambda key: "/x" in key)
    await store.open(background=False)
    answers = []
    names = ["Content-Type", "ETag", "Cache-Control", "Last-Modified", "X-Caf\u00e9", "Link"]
    values = ["image/jpeg", '"5f3c"', "max-age=3600", "caf\u00e9 \udcff", "a\"b\\c"]
    for i in range(n):
        k = rng.randrange(n // 3 + 1)
        host = f"h{k % 3}.example"
        key = f"http://{host}/{'x' if k % 5 == 0 else 'p'}/{k}\u00e9" if k % 7 == 0 else \
            f"http://{host}/{'x/' if k % 5 == 0 else ''}o{k}.jpg"
        if k % 11 == 0:
            key = f"{key}#chunk/4096/{k % 4}"
        vary, variant = ((("accept-encoding",), f"gzip{rng.randrange(3)}") if k % 13 == 0 else ((), ""))
        headers = tuple((rng.choice(names), rng.choice(values)) for _ in range(rng.randrange(5)))
        if rng.random() < 0.1:
            headers = dict(headers)
        elif rng.random() < 0.1:
            headers = [list(p) for p in headers]
        now = 1795922793.3171613 + i * 0.37
        record = dict(url=key if rng.random() < 0.7 else key + "?sig=1", host=host, headers=headers,
                      stored_at=now, expires_at=rng.choice([now + 3600, math.inf, now]),
                      stale_if_error=rng.choice([math.inf, 0.0, 30, 12.5, True]), age=rng.choice([0.0, 3, 1.5]),
                      stale_while_revalidate=rng.choice([0.0, 10]), status=rng.choice([200, 200, 404]),
                      authorize=rng.random() < 0.1)
        if rng.random() < 0.05:
            record["status"] = True
        body = rng.randbytes(rng.choice([0, 100, 3000, 16384]))
        try:
            meta = store.put_sealed(body, key=key, vary=vary, variant=variant, hot=rng.random() < 0.1, **record)
            answers.append(["stored", record_of(meta)])
        except (NotStored, NezhaError, TypeError, ValueError) as e:
            answers.append([type(e).__name__, str(e)])
        if rng.random() < 0.3:
            got = store.lookup(f"http://{host}/o{rng.randrange(n // 3 + 1)}.jpg")
            answers.append(None if got is None else record_of(got))
        answers.append(list(store.sizes()))
    await store.idle()
    files = {}
    for folder, _, names_here in os.walk(store.objects):
        for name in names_here:
            with open(os.path.join(folder, name), "rb") as f:
                files[name] = hashlib.sha256(f.read()).hexdigest()
    state = index_state(store)
    await store.close()
    return answers, files, state

def digest(x):
    return hashlib.sha256(json.dumps(x, sort_keys=True, default=repr).encode()).hexdigest()[:16]

work = sys.argv[1]
for spec in sys.argv[2:]:
    seed, capacity, n = map(int, spec.split(","))
    root = tempfile.mkdtemp(dir=work)
    answers, files, state = asyncio.run(run(root, seed, capacity or None, n))
    shutil.rmtree(root)
    print(seed, digest(answers), f"{digest(files)}/{len(files)}", digest(state), flush=True)
"""


def states(tree: Path, work: Path) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    out = subprocess.run([sys.executable, "-c", CHILD, str(work), *(f"{s},{c},{n}" for s, c, n in SEEDS)],
                         env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
    return out.split("\n")[:len(SEEDS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, the first the reference")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"))
    args = ap.parse_args()
    got = {}
    for name, d in (t.split("=", 1) for t in args.tree):
        got[name] = states(Path(d).resolve(), args.work)
        for line in got[name]:
            print(f"  {name}: seed {line.split()[0]}: answers {line.split()[1]} files {line.split()[2]} "
                  f"index {line.split()[3]}")
    ref = next(iter(got))
    differ = sorted({line.split()[0] for name in got for line, base in zip(got[name], got[ref]) if line != base})
    print("same" if not differ else f"differ: seeds {' '.join(differ)}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
