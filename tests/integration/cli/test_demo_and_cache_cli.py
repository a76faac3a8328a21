"""The commands a new user types first."""

import json
import subprocess
import sys


def nezha(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nezha", *args], capture_output=True, text=True, timeout=timeout)


def test_demo_downloads_cold_then_warm_and_checks_sha256():
    run = nezha("demo", "--size", "3MB", "--rate", "6MB", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["sha256_match"] is True
    assert result["cold_cache"] == "miss" and result["warm_cache"] == "hit"
    assert result["origin_gets"] == 1
    # The throttle holds the cold copy to 6 MB/s. Only the upper bound is
    # checked: load on the machine can slow a transfer, never speed it past
    # the origin's pacing, so a lower bound would be a flaky timing test.
    assert result["origin_rate_mb_per_s"] == 6.0
    assert result["cold_mb_per_s"] < 6.6
    assert result["warm_mb_per_s"] > result["cold_mb_per_s"] and result["speedup"] > 1


def test_cache_refuses_a_malformed_origin_naming_it():
    run = nezha("cache", "--origin", "no-equals-sign", "--data-dir", "/nonexistent-never-created")
    assert run.returncode == 2
    assert "HOST=UPSTREAM_URL" in run.stderr and "no-equals-sign" in run.stderr


def test_cache_refuses_a_non_http_upstream():
    run = nezha("cache", "--origin", "h.example=ftp://127.0.0.1/")
    assert run.returncode == 2 and "http:// or https://" in run.stderr


def test_demo_with_three_nodes_shows_a_peer_hit_in_the_index_stats():
    run = nezha("demo", "--size", "2000000", "--rate", "8000000", "--nodes", "3", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["sha256_match"] is True and result["origin_gets"] == 1
    assert result["cold_cache"] == "peer-miss" and result["warm_cache"] == "peer-hit"
    nodes = result["stats"]["nodes"]
    # Each download is counted once, by the node it entered; the owner fetched the bytes.
    assert sum(st["misses"] for st in nodes.values()) == 1
    assert sum(st["peer_hits"] for st in nodes.values()) == 1
    assert nodes[result["owner"]]["bytes_from_origin"] == 2_000_000


def test_demo_run_twice_with_keep_is_a_hit_the_second_time_with_matching_checksums(tmp_path):
    """The kept cache holds the first run's copy; the second run's origin serves the same file, so it is a hit."""
    keep = tmp_path / "keep"
    first = nezha("demo", "--size", "1MB", "--rate", "20MB", "--json", "--keep", str(keep))
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout.strip().splitlines()[-1])
    assert result["sha256_match"] is True and result["cold_cache"] == "miss"
    second = nezha("demo", "--size", "1MB", "--rate", "20MB", "--json", "--keep", str(keep))
    assert second.returncode == 0, (second.stdout, second.stderr)
    again = json.loads(second.stdout.strip().splitlines()[-1])
    assert again["sha256_match"] is True and again["sha256"] == result["sha256"]
    assert again["cold_cache"] == "hit" and again["warm_cache"] == "hit"
    assert again["origin_gets"] == 0


def test_demo_keep_naming_a_file_is_one_line_and_exit_2(tmp_path):
    from tests.integration.cli.test_bad_input import one_line

    file = tmp_path / "notes.txt"
    file.write_text("mine")
    one_line(nezha("demo", "--size", "1MB", "--keep", str(file)), 2, f"--keep '{file}'", "not a folder")
    assert file.read_text() == "mine"


def test_demo_keep_holding_another_size_is_refused_naming_the_size_it_holds(tmp_path):
    """The kept copy of another size would be served fresh in place of the new file."""
    import pytest

    from nezha.dev.demo import KEPT, SEED, check_keep
    from nezha.errors import ConfigError

    (tmp_path / KEPT).write_text(json.dumps({"bytes": 1_000_000, "seed": SEED}))
    check_keep(tmp_path, 1_000_000)
    with pytest.raises(ConfigError, match="holds the demo's file of 1000000 bytes.*pass --size 1000000"):
        check_keep(tmp_path, 2_000_000)


async def test_nezha_origin_serves_a_folder_slowly_by_hand_until_sigterm(tmp_path):
    """The slow local origin a user starts for `nezha up`: the demo's file, its validators, throttled."""
    import asyncio
    import hashlib
    import signal

    import aiohttp

    from nezha.dev.demo import PATH

    proc = subprocess.Popen([sys.executable, "-m", "nezha", "origin", str(tmp_path / "site"), "--listen",
                             "127.0.0.1:0", "--rate", "2MB", "--demo-file", "300KB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loop = asyncio.get_running_loop()
    try:
        line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 60)
        assert line.startswith("origin http://127.0.0.1:"), (line, proc.stderr.read() if not line else "")
        url = line.split()[1]
        async with aiohttp.ClientSession() as s:
            async with s.get(url + PATH) as r:
                body = await r.read()
                assert r.status == 200 and "ETag" in r.headers and "Last-Modified" in r.headers
        assert len(body) == 300_000
        assert hashlib.sha256(body).hexdigest() == hashlib.sha256(
            (tmp_path / "site" / PATH.lstrip("/")).read_bytes()).hexdigest()
        proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_nezha_origin_refuses_a_folder_that_is_a_file_and_a_bad_listen(tmp_path):
    from tests.integration.cli.test_bad_input import one_line

    file = tmp_path / "f"
    file.write_text("x")
    one_line(nezha("origin", str(file)), 2, f"'{file}'", "not a folder")
    one_line(nezha("origin", str(tmp_path), "--listen", "nowhere"), 2, "--listen 'nowhere'", "HOST:PORT")
