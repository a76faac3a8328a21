"""Settings come from one place, in a fixed order: flags, NEZHA_* env, YAML file, defaults."""

import pytest

from nezha.config import CacheSettings, Origin, load, parse_size
from nezha.errors import ConfigError


def test_flags_beat_environment_which_beats_the_yaml_file(tmp_path, monkeypatch):
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("listen: 127.0.0.1:7000\ncapacity: 1GiB\nreplicas: 3\n"
                   "origins:\n  - host: www.cs.toronto.edu\n    upstream: http://127.0.0.1:9000\n    default_ttl: 60\n")
    monkeypatch.setenv("NEZHA_CAPACITY", "2GiB")
    monkeypatch.setenv("NEZHA_REPLICAS", "2")
    s = load(CacheSettings, config_file=cfg, flags={"replicas": 1, "listen": None})
    assert s.replicas == 1  # flag
    assert s.capacity == 2 * 2**30  # env over file
    assert s.listen == "127.0.0.1:7000"  # file, since the flag was not given
    assert s.origins == [Origin(host="www.cs.toronto.edu", upstream="http://127.0.0.1:9000", default_ttl=60)]


@pytest.mark.parametrize("value", [
    "a.example=http://127.0.0.1:1,b.example=http://127.0.0.1:2",
    '["a.example=http://127.0.0.1:1", "b.example=http://127.0.0.1:2"]',
    '{"a.example": "http://127.0.0.1:1", "b.example": "http://127.0.0.1:2"}',
])
def test_origins_from_environment_as_a_comma_list_or_json(monkeypatch, value):
    monkeypatch.setenv("NEZHA_ORIGINS", value)
    s = load(CacheSettings)
    assert [(o.host, o.upstream) for o in s.origins] == [("a.example", "http://127.0.0.1:1"),
                                                         ("b.example", "http://127.0.0.1:2")]


@pytest.mark.parametrize("flags,message", [
    ({"origins": ["x.example"]}, "HOST=UPSTREAM_URL"),
    ({"origins": ["x.example=ftp://h/"]}, "http:// or https://"),
    ({"origins": ["x.example=http://a", "X.example=http://b"]}, "configured twice"),
    ({"listen": "nohostport"}, "listen must be HOST:PORT"),
    ({"capacity": "lots"}, "not a size"),
    ({"replicas": 0}, "replicas (0) must be at least 1"),
    ({"origins": ["x.example=http://a"], "parent": "https://nezha-cache"}, "must be http://HOST[:PORT]"),
    ({"origins": ["x.example=http://a"], "parent": "http://nezha-cache/some/path"}, "no path"),
    ({"origins": ["x.example=http://a"], "parent": "http://u:p@nezha-cache"}, "no credentials"),
    ({"origins": ["x.example=http://a"], "parent_tls_port": 0}, "is not a TCP port"),
])
def test_bad_settings_are_one_config_error_naming_the_field(flags, message):
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, flags=flags)
    assert message in str(e.value)


def test_the_parent_comes_from_the_flag_the_environment_or_the_file(tmp_path, monkeypatch):
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("parent: http://from-file:8080\norigins: [x.example=http://a]\n")
    assert load(CacheSettings, config_file=cfg).parent == "http://from-file:8080"
    monkeypatch.setenv("NEZHA_PARENT", "http://nezha-cache.datasets.svc:80/")
    assert load(CacheSettings, config_file=cfg).parent == "http://nezha-cache.datasets.svc"
    assert load(CacheSettings, config_file=cfg, flags={"parent": "http://10.0.0.7:8080"}).parent == "http://10.0.0.7:8080"
    assert load(CacheSettings, config_file=cfg).parent_tls_port == 443


@pytest.mark.parametrize("key", ["origin_resolver", "origin_nameservers"])
def test_a_removed_resolver_setting_in_a_file_is_refused_naming_what_replaced_it(tmp_path, key):
    """The node's own DNS client is gone: a file that still sets it is told where origins are found now."""
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text(f"origins: [x.example=http://a]\n{key}: dns\n")
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, config_file=cfg)
    assert f"--config {cfg}: {key!r} removed:" in str(e.value)
    assert "/etc/hosts is its own" in str(e.value) and "docs/deployment-models.md" in str(e.value)
    assert "unknown key" not in str(e.value)


def test_a_removed_resolver_variable_is_refused_naming_what_replaced_it(monkeypatch):
    monkeypatch.setenv("NEZHA_ORIGIN_NAMESERVERS", '["10.96.0.10"]')
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, flags={"origins": ["x.example=http://a"]})
    assert str(e.value).startswith("NEZHA_ORIGIN_NAMESERVERS: removed:")
    assert "the nameservers are those of /etc/resolv.conf" in str(e.value)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(CacheSettings, config_file=tmp_path / "absent.yaml")


@pytest.mark.parametrize("text,expect", [("1048576", 2**20), ("500M", 500 * 10**6), ("10GiB", 10 * 2**30),
                                         ("1.5k", 1500), (4096, 4096)])
def test_sizes_take_decimal_and_binary_suffixes(text, expect):
    assert parse_size(text) == expect


# -- the origin table: exact names and *.domain patterns (issue 13) ----------------

def test_a_wildcard_origin_covers_one_label_under_its_domain_and_an_exact_one_wins():
    from nezha.config import Origin, OriginTable

    exact = Origin(host="special.s3.amazonaws.com", upstream="https://mirror.example")
    pattern = Origin(host="*.s3.amazonaws.com", upstream="https://{host}")
    table = OriginTable([pattern, exact])
    assert table.get("datasets.s3.amazonaws.com") is pattern
    assert table.get("special.s3.amazonaws.com") is exact
    assert table.get("a.b.s3.amazonaws.com") is None and table.get("s3.amazonaws.com") is None
    assert "datasets.s3.amazonaws.com" in table and "evil.example" not in table
    assert table.certificate_name("datasets.s3.amazonaws.com") == "*.s3.amazonaws.com"
    assert table.certificate_name("special.s3.amazonaws.com") == "special.s3.amazonaws.com"
    assert table.certificate_name("evil.example") is None


def test_host_in_an_upstream_is_the_name_asked_for_and_only_for_patterns():
    from nezha.config import Origin

    pattern = Origin(host="*.blob.core.windows.net", upstream="http://{host}")
    assert pattern.upstream_for("http", "acct.blob.core.windows.net") == "http://acct.blob.core.windows.net"
    assert pattern.upstream_for("https", "acct.blob.core.windows.net") == "https://acct.blob.core.windows.net"
    with pytest.raises(ValueError, match=r"\{host\} in an upstream is for \*\.domain origins only"):
        Origin(host="huggingface.co", upstream="https://{host}")
    with pytest.raises(ValueError, match="not a hostname or a"):
        Origin(host="*.com", upstream="https://x.com")
    plain = Origin(host="www.cs.toronto.edu", upstream="http://www.cs.toronto.edu")
    assert plain.upstream_for("https", "www.cs.toronto.edu") == "https://www.cs.toronto.edu"  # TLS clients: https


def test_a_misspelt_key_inside_an_origin_entry_is_refused_with_a_suggestion(tmp_path):
    """An origin's settings decide what is cached for whom: a typo in one is an
    error, as a typo at the top level is, never a silently ignored line."""
    cfg = tmp_path / "nezha.yaml"
    cfg.write_text("origins:\n  - host: s3.example\n    upstream: http://127.0.0.1:9000\n"
                   "    volatile_parms: [X-Amz-Date]\n")
    with pytest.raises(ConfigError) as e:
        load(CacheSettings, config_file=cfg)
    [line] = str(e.value).splitlines()
    assert "origins[0].volatile_parms" in line and "unknown key" in line and "did you mean volatile_params?" in line


def test_an_origin_given_as_a_mapping_in_the_environment_refuses_unknown_keys_too(monkeypatch):
    monkeypatch.setenv("NEZHA_ORIGINS", '[{"host": "s3.example", "upstream": "http://127.0.0.1:9000", "ttl": 5}]')
    with pytest.raises(ConfigError, match=r"NEZHA_ORIGINS\[0\]\.ttl: unknown key"):
        load(CacheSettings)


# -- nezha up: the node's settings, one model (issue 21) ------------------------------

UP_ORIGIN = ["www.cs.toronto.edu=http://127.0.0.1:9"]


@pytest.mark.parametrize("nodes,replicas", [(1, 1), (2, 2), (5, 2)])
def test_up_owners_per_key_default_to_two_at_most_and_never_more_than_its_nodes(nodes, replicas):
    from nezha.config import UpSettings

    assert load(UpSettings, flags={"origins": UP_ORIGIN, "nodes": nodes}).replicas == replicas


def test_up_passes_on_the_node_settings_it_read_but_not_those_it_sets_per_node(tmp_path, monkeypatch):
    from nezha.config import UpSettings

    cfg = tmp_path / "up.yaml"
    cfg.write_text("fill_streams: 4\nrequest_head_timeout: 9\n")
    monkeypatch.setenv("NEZHA_CAPACITY", "1GiB")
    s = load(UpSettings, config_file=cfg, flags={"origins": UP_ORIGIN, "ca_cert": None})
    assert s.node_settings() == {"capacity": 2**30, "fill_streams": 4, "request_head_timeout": 9.0, "workers": 1}


def test_a_node_runs_a_worker_per_cpu_by_default_but_nezha_up_one_per_node(monkeypatch):
    """Nodes of `nezha up` share one machine: a worker per CPU each would
    contend for every core; `--workers` chooses otherwise."""
    from nezha.config import UpSettings

    assert load(CacheSettings, config_file=None, flags={"origins": UP_ORIGIN}).workers == "auto"
    assert load(UpSettings, config_file=None, flags={"origins": UP_ORIGIN}).node_settings()["workers"] == 1
    monkeypatch.setenv("NEZHA_WORKERS", "auto")
    assert load(UpSettings, config_file=None, flags={"origins": UP_ORIGIN}).node_settings()["workers"] == "auto"


@pytest.mark.parametrize("env,message", [
    ({"NEZHA_NODE_ID": "n"}, "node_id (NEZHA_NODE_ID, or node_id in --config): nezha up sets it for each node"),
    ({"NEZHA_TLS_LISTEN": "127.0.0.1:1"}, "use --tls-base-port"),
    ({"NEZHA_NODES": "0"}, "--nodes (0) must be at least 1"),
    ({"NEZHA_TLS_BASE_PORT": "65535", "NEZHA_NODES": "2"}, "--tls-base-port 65535: node-1 would listen on port 65536"),
])
def test_up_refuses_what_cannot_work_naming_it(monkeypatch, env, message):
    from nezha.config import UpSettings

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        load(UpSettings, flags={"origins": UP_ORIGIN})
    assert message in str(e.value)
