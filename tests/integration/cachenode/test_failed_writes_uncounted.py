"""A write the disk fails after the store admitted the object leaves the store's figures as they were
(cachenode/store/disk.py `commit`, cachenode/store/small.py `put_sealed`): used bytes, object count, the
hit ratio and working set the eviction policy's census reports. The read that stores the object later is
counted once.

A small body is first written at once (`put_sealed`) and, when that fails, handed to the general fill,
which asks the store again: both admitted it, and each counted a miss of its own.
"""

from __future__ import annotations

import errno
import math
import os
import re

import pytest

MAX_AGE = {"Cache-Control": "max-age=3600"}
SIZES = {"small": 20_000, "large": 300_000}  # one sealed file; a data file and its meta (store/small.py SMALL_MAX)


async def figures(node, session) -> dict[str, float]:
    """The store's figures as the node reports them on /metrics."""
    async with session.get(node.url + "/metrics") as r:
        text = await r.text()
    found = {}
    for name in ("nezha_stored_bytes", "nezha_stored_objects", "nezha_hit_ratio_last_hour",
                 "nezha_working_set_bytes"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        assert m is not None, f"{name} is not on /metrics"
        found[name] = float(m.group(1))
    return found


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    return all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


@pytest.mark.parametrize("fault", ["into-place", "enospc"])
@pytest.mark.parametrize("size", list(SIZES))
async def test_a_write_that_fails_after_admission_leaves_the_stores_figures_as_they_were(
        origin, make_node, session, monkeypatch, size, fault):
    kept, failed = os.urandom(SIZES[size]), os.urandom(SIZES[size])
    origin.put("/kept", kept, headers=MAX_AGE)
    origin.put("/failed", failed, headers=MAX_AGE)
    node = await make_node()
    store = node.node.store
    for _ in range(2):  # a miss that stores it, then a hit
        assert (await node.get(session, "/kept"))[2] == kept
    await node.node.settled()
    before = await figures(node, session)
    assert before["nezha_stored_objects"] == 1 and before["nezha_hit_ratio_last_hour"] == 0.5

    tmp, objects = str(store.tmp), str(store.objects)
    real_rename, real_fsync, real_pwrite, real_open = os.rename, os.fsync, os.pwrite, os.open

    def rename(src, dst, *args, **kwargs):
        if str(src).startswith(tmp):  # a commit's rename into place
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_rename(src, dst, *args, **kwargs)

    def create(path, flags, *args, **kwargs):  # a small body stored at once: created under its final name
        if flags & os.O_CREAT and str(path).startswith(objects):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_open(path, flags, *args, **kwargs)

    def fsync(fd):  # a large commit's fsync: the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def pwrite(fd, data, offset):  # a small body written with its seal: the disk is full
        real_pwrite(fd, bytes(data)[:100], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if fault == "into-place":  # the step that puts the file where it is served fails, on every path
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(os, "open", create)
    else:
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "pwrite", pwrite)
    status, _, got = await node.get(session, "/failed")
    await node.node.settled()
    assert (status, got) == (200, failed), "the client gets the body, stored or not"
    assert "http://www.cs.toronto.edu/failed" not in store
    after = await figures(node, session)
    assert same(after, before), f"a write that failed changed the store's figures: {before} -> {after}"
    assert store.index.usage.reserved == 0, "the failed write's room was given back"

    monkeypatch.undo()
    assert (await node.get(session, "/failed"))[2] == failed
    await node.node.settled()
    stored = await figures(node, session)
    assert stored["nezha_stored_objects"] == 2 and stored["nezha_stored_bytes"] == 2 * SIZES[size]
    # Reads of the store: /kept's miss and hit, /failed's one miss (the failed write counted none).
    assert stored["nezha_hit_ratio_last_hour"] == pytest.approx(1 / 3)
    assert stored["nezha_working_set_bytes"] == 2 * SIZES[size]
