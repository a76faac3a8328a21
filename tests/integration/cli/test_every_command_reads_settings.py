"""`nezha --help` promises that every flag is also a NEZHA_* variable and a key of --config FILE: `demo`,
`origin` and `ca init` keep it as the other commands do, and refuse a NEZHA_* variable no command reads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.integration.cli.test_bad_input import nezha, one_line

# A tiny, fast demo: what the flags --size 1MB --rate 50MB would ask for.
SMALL = {"NEZHA_SIZE": "1MB", "NEZHA_RATE": "50MB"}


def test_demo_takes_its_size_and_rate_from_nezha_variables():
    run = nezha("demo", "--json", env=SMALL)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["bytes"] == 1_000_000 and result["origin_rate_mb_per_s"] == 50.0 and result["sha256_match"]


def test_demo_takes_a_config_file_and_its_flags_win_over_it(tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text("size: 5MB\nrate: 50MB\n")
    run = nezha("demo", "--config", str(config), "--size", "1MB", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["bytes"] == 1_000_000 and result["origin_rate_mb_per_s"] == 50.0


def test_demo_refuses_a_variable_no_command_reads_with_a_suggestion():
    one_line(nezha("demo", "--json", env={**SMALL, "NEZHA_SIZZE": "1MB"}), 2,
             "nezha demo: NEZHA_SIZZE: not a setting of nezha demo or any other nezha command",
             "did you mean NEZHA_SIZE?")


def test_demo_names_a_bad_variable_as_the_user_set_it():
    one_line(nezha("demo", env={"NEZHA_SIZE": "ten"}), 2, "NEZHA_SIZE 'ten'", "not a size")


def test_origin_listens_where_nezha_listen_says(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_") or k.startswith("NEZHA_TEST_")}
    proc = subprocess.Popen([sys.executable, "-m", "nezha", "origin", str(tmp_path / "files")],
                            env={**clean, "NEZHA_LISTEN": f"127.0.0.1:{port}", "NEZHA_RATE": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert first.startswith(f"origin http://127.0.0.1:{port} "), (first, err)
    assert "unthrottled" in first


def test_origin_refuses_a_bad_listen_variable_before_serving(tmp_path):
    one_line(nezha("origin", str(tmp_path / "files"), env={"NEZHA_LISTEN": "nowhere"}), 2,
             "nezha origin: NEZHA_LISTEN 'nowhere'", "HOST:PORT")


def test_ca_init_keeps_the_ca_where_nezha_local_says(tmp_path):
    folder = tmp_path / "ca"
    run = nezha("ca", "init", env={"NEZHA_LOCAL": str(folder)})
    assert run.returncode == 0 and run.stdout.startswith("created "), run.stderr
    assert (folder / "ca.crt").is_file() and (folder / "ca.key").is_file()


def test_ca_init_refuses_both_places_or_neither_naming_the_two_flags(tmp_path):
    one_line(nezha("ca", "init", "--local", str(tmp_path / "ca"), env={"NEZHA_NAMESPACE": "nezha"}), 2,
             "--namespace NS", "--local DIR", "both are set")
    one_line(nezha("ca", "init"), 2, "--namespace NS", "--local DIR", "neither is set")
    assert not (tmp_path / "ca").exists()
