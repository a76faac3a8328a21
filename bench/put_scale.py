#!/usr/bin/env python3
"""A small object's store write (`Store.put_sealed`) as the store fills: does its CPU grow with the objects held?

A node should do no per-request work that grows with the number of objects
it stores. For each size N (`--sizes`), a fresh process per size and mode
builds two `Store`s as `nezha cache` builds its own by default
(cachenode/app.py, from `CacheSettings`; the node's young-collection
threshold from cachenode/cli.py) on `--work` (/dev/shm): one filled with N
objects, a reference one with the smallest size's. Both are filled through
`put_sealed` with the keywords fill/at_once.py `store_whole` passes and
distinct keys shaped like a dataset's
(`images.bench/train/nXXXXXXXX/ILSVRC2012_train_NNNNNNNN.JPEG`), 16 KiB
bodies. Then `--batches` batches of `--batch` more puts go to each in turn,
so that the box's load (other processes on its two cores) weighs on both
alike, each batch timed by the process's user + system CPU
(`time.process_time`, exact) and its user CPU (`resource.getrusage`, summed
over the batches: its user/system split is sampled at the clock's ticks).

Three modes: `open`, no capacity (`nezha cache`'s default: a store grows by
the timed puts); `capped`, a capacity of its objects and the timed ones, so
that the policy weighs and admits each put (`Index.admits`, `arrived`)
without evicting; `full`, a capacity of the objects it holds, full when the
timed puts begin: each is a newcomer read once, refused by the policy as it
refuses a first epoch's scan beyond the capacity (cachenode/store/policy.py)
after room was sought for it, and the store stays as it is.

    python bench/put_scale.py --sizes 1000,10000,100000,300000 --modes open,capped,full

Prints per mode and size the minimum over the batches of the user + system
microseconds per put and the mean user microseconds per put, for the store
of N and the reference store alongside, then per mode the ratios of the
largest size's figures to the smallest size's, each against its own
reference (1.0: no growth), and last `ratios: open=... capped=... full=...`
(the user + system ones). And the slowest single put while the store of N
was filled (its thread's CPU, `time.thread_time`) and how many objects it
found stored: the put that doubles the index's table and the policy's
history (cachenode/store/table.py, cachenode/store/policy.py `Policy._grow`)
once rebuilt them whole, in time proportional to the objects stored; they
now move a few entries per put over the puts that follow, so a store of N
timed soon after a doubling (300,000 is 38,000 puts past the one at 262,144)
pays that moving in its timed puts. N bodies are held in `--work` at once
(300,000 of 16 KiB: 4.9 GB): mind the room there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Run in its own process: two stores filled, then their timed batches in turn; one JSON line of figures (us).
CHILD = r"""
import asyncio, json, os, resource, sys, time
from cachenode.cli import collect_young_less_often
from cachenode.store.disk import Store
from cachenode.store.objects import NotStored
from nezha.config.cache import CacheSettings

HOST = "images.bench"
HEADERS = (("Content-Type", "image/jpeg"), ("ETag", '"5f3c-4000"'), ("Cache-Control", "max-age=3600"),
           ("Last-Modified", "Sat, 28 Nov 2026 11:00:00 GMT"))
REFUSED = {}


def key_of(i):
    return f"{HOST}/train/n{1440764 + i // 1300:08d}/ILSVRC2012_train_{i:08d}.JPEG"


def put(store, body, i, now):
    key = key_of(i)
    try:
        store.put_sealed(body, key=key, vary=(), variant="", url="http://" + key, host=HOST, headers=HEADERS,
                         stored_at=now, status=200, expires_at=now + 3600, stale_if_error=None, age=0,
                         stale_while_revalidate=None, authorize=False)
    except NotStored:
        REFUSED[id(store)] = REFUSED.get(id(store), 0) + 1  # the node passes such an answer on unstored


async def filled(root, n, first, mode, body, timed):
    capacity = None
    if mode != "open":
        # The objects' files as the store counts them: one body put and measured.
        probe = Store(os.path.join(root, "probe"), sync_interval=3600)
        await probe.open(background=False)
        put(probe, body, 0, time.time())
        capacity = (n + timed if mode == "capped" else n) * probe.used_bytes
        await probe.close()
    settings = CacheSettings(data_dir=os.path.join(root, "node"), origins=[f"{HOST}=http://127.0.0.1:9"], capacity=capacity)
    store = Store(settings.data_dir, capacity=settings.capacity, hot_capacity=settings.hot_capacity,
                  pinned_capacity=settings.pinned_capacity, small_max=settings.small_object_max,
                  sync_interval=settings.sync_interval, verify_reads=settings.verify_reads)
    await store.open(background=False)
    now = time.time()
    slowest = (0.0, 0)
    for i in range(first, first + n):
        t0 = time.thread_time()
        put(store, body, i, now)
        slowest = max(slowest, (time.thread_time() - t0, i - first))
    return store, slowest


async def main(root, n, ref, mode, size, batches, batch):
    collect_young_less_often()
    body = os.urandom(size)
    timed = batches * batch
    stores, slowest = {}, {}
    stores["n"], slowest["n"] = await filled(os.path.join(root, "n"), n, 0, mode, body, timed)
    if n != ref:
        stores["ref"], slowest["ref"] = await filled(os.path.join(root, "ref"), ref, 50_000_000, mode, body, timed)
    next_key = {"n": n, "ref": 50_000_000 + ref}
    cpu = {name: [] for name in stores}
    user = dict.fromkeys(stores, 0.0)
    now = time.time()
    for _ in range(batches):
        for name, store in stores.items():
            i = next_key[name]
            u0, c0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime, time.process_time()
            for i in range(i, i + batch):
                put(store, body, i, now)
            cpu[name].append((time.process_time() - c0) / batch * 1e6)
            user[name] += resource.getrusage(resource.RUSAGE_SELF).ru_utime - u0
            next_key[name] = i + 1
            await asyncio.sleep(0)  # the group sync's turn, as between a node's fills
    out = {name: {"cpu_min": min(cpu[name]), "user_mean": user[name] / timed * 1e6, "stored": len(store),
                  "refused": REFUSED.get(id(store), 0), "slowest": slowest[name]} for name, store in stores.items()}
    print(json.dumps(out))
    for store in stores.values():
        await store.close()

asyncio.run(main(sys.argv[1], *map(int, sys.argv[2:4]), sys.argv[4], *map(int, sys.argv[5:8])))
"""


def one(tree: Path, work: Path, n: int, ref: int, mode: str, args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="nezha-put-scale-", dir=work))
    try:
        env = dict(os.environ, PYTHONPATH=str(tree))
        out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(n), str(ref), mode, str(args.body),
                              str(args.batches), str(args.batch)],
                             env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)
    got = json.loads(out.splitlines()[-1])
    got.setdefault("ref", got["n"])
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", type=Path, default=Path("."), help="the checkout whose cachenode is measured")
    ap.add_argument("--sizes", default="1000,10000,100000,300000", help="objects stored before the timed puts")
    ap.add_argument("--modes", default="open,capped,full", help="open (no capacity), capped, full (see above)")
    ap.add_argument("--body", type=int, default=16 * 1024)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--work", type=Path, default=Path("/dev/shm"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    tree = args.tree.resolve()
    last = {}
    for mode in args.modes.split(","):
        ratio, user = {}, {}
        for n in sizes:
            got = one(tree, args.work, n, sizes[0], mode, args)
            a, r = got["n"], got["ref"]
            ratio[n], user[n] = a["cpu_min"] / r["cpu_min"], a["user_mean"] / r["user_mean"]
            print(f"{mode:6} {n:>8,} stored: user+sys {a['cpu_min']:6.1f} us per put (min), user {a['user_mean']:6.1f}"
                  f" (mean); reference of {sizes[0]:,}: {r['cpu_min']:6.1f}, {r['user_mean']:6.1f}; "
                  f"{a['stored']:,} stored at the end, {a['refused']:,} refused; slowest put while filling "
                  f"{a['slowest'][0] * 1e3:.1f} ms, with {a['slowest'][1]:,} stored", flush=True)
        print(f"{mode:6} per put at {sizes[-1]:,} / at {sizes[0]:,}, each against its reference: user+sys (min) "
              f"{ratio[sizes[-1]] / ratio[sizes[0]]:.2f}, user (mean) {user[sizes[-1]] / user[sizes[0]]:.2f}", flush=True)
        last[mode] = ratio[sizes[-1]] / ratio[sizes[0]]
    print("ratios: " + " ".join(f"{mode}={r:.2f}" for mode, r in last.items()))


if __name__ == "__main__":
    main()
