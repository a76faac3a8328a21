"""Ordinary mistakes at the command line: one line naming the flag, variable or file key, and nothing started.

Exit 2 for bad settings (nothing bound, nothing written), 1 for a failure
at run time such as a port in use; never a traceback (issue 14).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

ORIGIN = "www.cs.toronto.edu=http://127.0.0.1:9"


def nezha(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_") or k.startswith("NEZHA_TEST_")}
    return subprocess.run([sys.executable, "-m", "nezha", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **(env or {})})


def one_line(run: subprocess.CompletedProcess, code: int, *words: str) -> str:
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert "Traceback" not in run.stderr and "Unclosed" not in run.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_cache_node_on_a_port_in_use_says_so_in_one_line_and_exits_1(taken_port, tmp_path):
    run = nezha("cache", "--listen", f"127.0.0.1:{taken_port}", "--origin", ORIGIN, "--data-dir", str(tmp_path / "d"))
    one_line(run, 1, "nezha cache: cannot listen on", f"127.0.0.1:{taken_port}", "--listen", "address already in use")


def test_the_webhook_on_a_port_in_use_says_so_in_one_line_and_exits_1(taken_port, tmp_path):
    leaf = trustme.CA().issue_cert("127.0.0.1")
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    rules = tmp_path / "rules.yaml"
    rules.write_text("- name: d\n  app: a\n  label: b\n  hostAliases:\n    - ip: 10.0.0.1\n      hostnames: [h.example]\n")
    run = nezha("webhook", "--listen", f"127.0.0.1:{taken_port}", "--tls-cert", str(tmp_path / "tls.crt"),
                "--tls-key", str(tmp_path / "tls.key"), "--rules", str(rules))
    one_line(run, 1, "nezha webhook: cannot listen on", "address already in use")


def test_a_data_dir_that_cannot_be_made_is_named(tmp_path):
    one_line(nezha("cache", "--origin", ORIGIN, "--data-dir", "/proc/nope"), 2, "--data-dir '/proc/nope'",
             "cannot be created")


def test_a_data_dir_that_is_a_file_is_named(tmp_path):
    file = tmp_path / "passwd"
    file.write_text("x")
    one_line(nezha("cache", "--origin", ORIGIN, "--data-dir", str(file)), 2, f"--data-dir '{file}'",
             "not a folder")


def test_a_config_file_that_is_not_yaml_is_named_with_the_line(tmp_path):
    config = tmp_path / "nezha.yaml"
    config.write_text("origins: [\n")
    one_line(nezha("cache", "--config", str(config), "--data-dir", str(tmp_path / "d")), 2,
             f"--config {config}: not valid YAML at line 2")
    assert not (tmp_path / "d").exists()


def test_a_node_without_an_origin_is_refused():
    one_line(nezha("cache"), 2, "no origin configured", "--origin HOST=UPSTREAM_URL")


def test_an_unknown_log_level_is_refused_from_the_flag_and_from_the_environment(tmp_path):
    run = nezha("cache", "--origin", ORIGIN, "--log-level", "verbose")
    assert run.returncode == 2 and "invalid choice: 'verbose'" in run.stderr
    one_line(nezha("cache", "--origin", ORIGIN, "--data-dir", str(tmp_path / "d"), env={"NEZHA_LOG_LEVEL": "verbose"}),
             2, "NEZHA_LOG_LEVEL 'verbose'", "debug, info, warning")


def test_a_misspelt_key_in_the_config_file_is_refused_with_a_suggestion(tmp_path):
    config = tmp_path / "nezha.yaml"
    config.write_text(f"origins: ['{ORIGIN}']\ncapasity: 1GiB\n")
    line = one_line(nezha("cache", "--config", str(config), "--data-dir", str(tmp_path / "d")), 2,
                    "unknown key 'capasity'", "did you mean capacity?")
    assert str(config) in line
    assert not (tmp_path / "d").exists()


def test_a_misspelt_variable_is_refused_with_a_suggestion(tmp_path):
    one_line(nezha("cache", "--origin", ORIGIN, "--data-dir", str(tmp_path / "d"), env={"NEZHA_CAPACTY": "1GiB"}), 2,
             "NEZHA_CAPACTY: not a setting of nezha cache or any other nezha command", "did you mean NEZHA_CAPACITY?")
    assert not (tmp_path / "d").exists()


def test_each_problem_is_its_own_line_naming_its_source(tmp_path):
    run = nezha("cache", "--origin", ORIGIN, "--listen", "nope", "--data-dir", str(tmp_path / "d"),
                env={"NEZHA_CAPACITY": "lots"})
    assert run.returncode == 2
    lines = run.stderr.splitlines()
    assert len(lines) == 2, run.stderr
    assert any(line.startswith("nezha cache: --listen 'nope'") for line in lines)
    assert any(line.startswith("nezha cache: NEZHA_CAPACITY 'lots'") for line in lines)


def test_a_cluster_node_without_the_cluster_token_is_refused_and_writes_nothing(redis_server, tmp_path):
    import redis

    line = one_line(nezha("cache", "--origin", ORIGIN, "--redis-url", redis_server.url, "--data-dir",
                          str(tmp_path / "d")), 2, "NEZHA_CLUSTER_TOKEN", "--redis-url")
    assert "internal endpoints" in line
    assert redis.Redis(host="127.0.0.1", port=redis_server.port).keys("nezha:*") == []  # no /etc/hosts on a bare root
    assert not (tmp_path / "d").exists()


def test_nezha_up_refuses_more_owners_per_key_than_nodes(tmp_path):
    one_line(nezha("up", "--origin", ORIGIN, "--nodes", "2", "--replicas", "3", "--data-dir", str(tmp_path / "u")),
             2, "--replicas 3: cannot exceed --nodes (2)")
    assert not (tmp_path / "u").exists()


@pytest.mark.parametrize("size", ["10MB", "1.5MiB", "2000000"])
def test_demo_sizes_take_suffixes_and_a_bad_one_is_named(size):
    assert "--size" not in nezha("demo", "--size", size, "--help").stderr  # parses
    one_line(nezha("demo", "--size", "ten"), 2, "--size 'ten'", "not a size")
    one_line(nezha("demo", "--rate", "0"), 2, "--rate '0': must be positive")


def test_version_and_help_speak_to_users():
    run = nezha("--version")
    assert run.returncode == 0 and run.stdout.startswith("nezha ")
    help_text = nezha("--help").stdout
    assert "flags -> settings" not in help_text and "caches the datasets" in help_text
    cache_help = nezha("cache", "--help").stdout
    for default in ("default ./nezha-data", "default: unbounded", "default: --listen"):
        assert default in cache_help.replace("\n", " ").replace("  ", " ") or default in cache_help
    assert "default 8080" in nezha("up", "--help").stdout
    assert "default 1" in nezha("demo", "--help").stdout


def test_webhook_certs_without_a_cluster_suggests_only_what_applies():
    env = {"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}
    run = nezha("webhook", "certs", env=env)
    assert run.returncode == 2
    assert "--kubeconfig" in run.stderr and "--cache-ip" not in run.stderr


def test_a_variable_another_command_reads_is_left_alone():
    """A pod's environment serves every command run in it: `kubectl exec nezha-cache-0 -- nezha stats`."""
    run = nezha("stats", env={"NEZHA_CLUSTER_TOKEN": "t", "NEZHA_SHUTDOWN_GRACE": "25"})
    one_line(run, 2, "no index to talk to")


@pytest.mark.parametrize("argv, typo, meant", [
    (["cache", "--origin", ORIGIN, "--capasity", "1G"], "--capasity", "--capacity"),
    (["up", "--orign", ORIGIN], "--orign", "--origin"),  # even when the flag it meant is required
    (["ca", "init", "--locl", "d"], "--locl", "--local"),
    (["cache", "--origin", ORIGIN, "--data-dri=d"], "--data-dri", "--data-dir"),
])
def test_a_misspelt_flag_is_named_with_a_suggestion_for_its_command(argv, typo, meant, tmp_path):
    line = one_line(nezha(*argv), 2, f"unknown flag {typo}", f"did you mean {meant}?")
    assert line.startswith(f"nezha {argv[0]}")


def test_an_origin_without_an_equals_sign_is_named_as_typed_not_as_a_python_list():
    line = one_line(nezha("cache", "--origin", "no-equals-sign"), 2, "--origin 'no-equals-sign'", "HOST=UPSTREAM_URL")
    assert "[" not in line


def test_a_listen_port_out_of_range_names_the_range(tmp_path):
    line = one_line(nezha("cache", "--origin", ORIGIN, "--listen", "127.0.0.1:99999", "--data-dir", str(tmp_path / "d")),
                    2, "--listen '127.0.0.1:99999'", "port 99999", "0-65535")
    assert "must be HOST:PORT" not in line


def test_ca_init_local_naming_a_file_says_it_is_not_a_folder(tmp_path):
    file = tmp_path / "ca.pem"
    file.write_text("mine")
    one_line(nezha("ca", "init", "--local", str(file)), 2, f"--local '{file}'", "exists and is not a folder")
    assert file.read_text() == "mine"


def test_nezha_up_refuses_a_per_node_setting_it_sets_itself(tmp_path):
    one_line(nezha("up", "--origin", ORIGIN, "--data-dir", str(tmp_path / "u"), env={"NEZHA_LISTEN": "127.0.0.1:1"}),
             2, "NEZHA_LISTEN", "nezha up sets it for each node", "--base-port")
    assert not (tmp_path / "u").exists()


def test_nezha_up_refuses_a_base_port_whose_nodes_would_pass_the_last_port(tmp_path):
    one_line(nezha("up", "--origin", ORIGIN, "--nodes", "3", "--base-port", "65534", "--data-dir", str(tmp_path / "u")),
             2, "--base-port 65534", "node-2", "65536", "0-65535")


def test_nezha_up_names_a_misspelt_variable_as_the_node_does(tmp_path):
    one_line(nezha("up", "--origin", ORIGIN, "--data-dir", str(tmp_path / "u"), env={"NEZHA_CAPACTY": "1G"}), 2,
             "NEZHA_CAPACTY: not a setting of nezha up", "did you mean NEZHA_CAPACITY?")
