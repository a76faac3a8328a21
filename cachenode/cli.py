"""`nezha cache`: one node."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import sys
from pathlib import Path

from nezha.config import CacheSettings, VerifySettings, load, parse_hostport
from nezha.config.flags import add_settings, given
from nezha.errors import ConfigError
from nezha.folder_lock import hold
from nezha.logs import configure


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache", help="run one cache node",
        description="Run one cache node: it answers requests for the configured origins (--origin) on --listen, "
                    "from its disk (--data-dir) when it holds the object, else from the origin, storing what it "
                    "fetched. With --redis-url it joins a cluster, where each key has owners and a node that does "
                    "not own one asks them. Every flag is also a NEZHA_* variable and a key of --config FILE.")
    add_settings(p, CacheSettings, command="cache")
    p.set_defaults(func=run_cache)
    v = sub.add_parser(
        "verify", help="check a stopped node's stored objects",
        description="Read every object in a stopped node's data folder and check it: a small object against "
                    "its seal, a large one against its length and the node's own block checksums. Prints each "
                    "bad object (its file, key and why) and exits 1 if there is any, 0 if none; changes nothing.")
    add_settings(v, VerifySettings, command="verify")
    v.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from cachenode.store.offline import Report, bad_objects

    settings = load(VerifySettings, config_file=args.config, flags=given(args))
    data_dir = settings.data_dir
    if not (data_dir / "objects").is_dir():
        why = "does not exist" if not data_dir.exists() else "holds no objects/ folder: no node's data folder"
        raise ConfigError(f"data folder {data_dir} {why} (--data-dir, NEZHA_DATA_DIR)")
    report = Report()
    bad = 0
    for found in bad_objects(data_dir, report):
        bad += 1
        print(f"bad: {found.path}" + (f" key={found.key}" if found.key else "") + f": {found.why}")
    unchecked = f", {report.unchecked} large stored before block checksums (length checked only)" \
        if report.unchecked else ""
    print(f"{report.checked} objects, {report.bytes} bytes checked: {bad} bad{unchecked}")
    return 1 if bad else 0


def run_cache(args: argparse.Namespace) -> int:
    # The node's modules (aiohttp, the store, prometheus, ...) are imported below only where
    # a node runs here: the supervisor of several workers needs none of them (supervisor.py).
    from cachenode.workers import supervisor

    settings = load(CacheSettings, config_file=args.config, flags=given(args))
    if settings.redis_url and not settings.cluster_token:
        raise ConfigError("a node that joins a cluster (--redis-url) needs the cluster token its peers share: set "
                          "NEZHA_CLUSTER_TOKEN (or cluster_token in --config); without it any local client could "
                          "drive its internal endpoints")
    ca = None
    if settings.ca_cert is not None and settings.ca_key is not None:
        from cachenode.app import read_ca

        ca = read_ca(settings)  # like every setting, checked before anything is made or bound
    run = asyncio.run
    if settings.event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise ConfigError("event_loop is uvloop (NEZHA_EVENT_LOOP, or event_loop in --config), but the uvloop "
                              "package is not installed: pip install uvloop") from None
        run = uvloop.run
    prepare_data_dir(settings.data_dir)
    role = os.environ.get(supervisor.ROLE_ENV)
    if role is None:
        # One node per data folder, held until this process (and with workers, the last of them) ends.
        lock = hold(settings.data_dir, command="nezha cache")
        workers = worker_count(settings.workers)
        if workers > 1:
            # Before logging is configured: this process only execs the supervisor, which
            # writes its own lines (cachenode/workers/log_lines.py) and never imports structlog.
            tls = None if settings.tls_listen is None else parse_hostport(settings.tls_listen, field="tls_listen")
            return supervisor.supervise(getattr(args, "argv", None) or sys.argv[1:], workers,
                                        {"listen": settings.listen_addr, "tls_listen": tls}, keep_fds=(lock,),
                                        log_level=settings.log_level)
    configure(level=settings.log_level, cache_loggers=True,
              credential_params=[name for o in settings.origins for name in o.credential_params])
    collect_young_less_often()
    if role is None:
        from cachenode.app import serve

        run(serve(settings, ca=ca))
        return 0
    import structlog

    # Port 0 in the settings: the one the supervisor chose for every worker.
    settings = settings.model_copy(update=supervisor.shared_addresses(os.environ))
    link = socket.socket(fileno=int(os.environ[supervisor.LINK_ENV]))
    index = int(os.environ.get(supervisor.INDEX_ENV, "0"))
    structlog.contextvars.bind_contextvars(worker=index)
    from cachenode.app import serve
    from cachenode.front.connections import raise_open_files_limit
    from cachenode.workers.follower import serve_follower
    from cachenode.workers.primary import Primary

    if role == "primary":
        run(serve(settings, ca=ca, reuse_port=True, primary=Primary(link)))
        return 0
    return run(serve_follower(settings, link=link, worker=index, open_files=raise_open_files_limit()))


# Container allocations (net) between two passes of the collector over its youngest
# generation; Python's default is 700. At 700 a node under cold small fills ran a
# young pass every 20 or so fills (about 200 us each) and a full pass over every
# object it holds every few seconds (30 ms at 74,000 objects): about 26 us per fill
# timed in the collector, 15 to 40 us less CPU per fill in paired runs at 20,000
# (bench/small_fills_ab.py; docs/benchmarks.md, "A cold small fill's garbage
# collected less often").
YOUNG_THRESHOLD = 20_000


def collect_young_less_often() -> None:
    """Run the cyclic garbage collector's youngest pass every `YOUNG_THRESHOLD`
    allocations instead of every 700: a node serving thousands of requests a
    second ran one every few fills, and each also promoted what it found alive
    towards the full passes over every object the node holds. Garbage in cycles
    waits longer (at most that many young containers, a few MB); nothing
    else changes. The older generations keep their thresholds."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


# Where the cgroup's limits are read: v2 first, then v1's memory controller.
CPU_MAX_FILES = (Path("/sys/fs/cgroup/cpu.max"),)
MEMORY_MAX_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def _first_readable(paths: tuple[Path, ...]) -> str | None:
    for path in paths:
        try:
            return path.read_text()
        except OSError:
            continue
    return None


def worker_count(workers: int | str) -> int:
    """`workers`, with auto resolved from this process's affinity, its cgroup's
    CPU quota and memory limit (cachenode/workers/plan.py)."""
    from cachenode.workers.plan import auto_workers

    if workers != "auto":
        return int(workers)
    return auto_workers(affinity=len(os.sched_getaffinity(0)), cpu_max=_first_readable(CPU_MAX_FILES),
                        memory_max=_first_readable(MEMORY_MAX_FILES))


def prepare_data_dir(path: Path) -> None:
    """The data folder, made now (after every other setting was checked) or refused naming --data-dir."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--data-dir {str(path)!r}: cannot be created: {e.strerror}") from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--data-dir {str(path)!r}: not writable by this user")
