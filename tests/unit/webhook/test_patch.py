"""webhook.patch: rules in the original Nezha format -> JSON-patch ops."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import urllib.request

import hypothesis
import jsonpatch
import kubernetes_validate
import pytest
from hypothesis import strategies as st

import webhook.patch
from webhook.containers import MAX_CONTAINERS
from webhook.ops import Patch, PatchError, TooManyContainers, escape
from webhook.patch import DEFAULT_NO_PROXY, INJECTED, patch_for
from webhook.rules import RuleError, parse_rules

HOSTS = ["download.tensorflow.org", "www.cs.toronto.edu"]
KEY = "app.kubernetes.io/deploy-manager"

RULES = parse_rules(f"""
- name: dataset
  app: {KEY}
  label: ksonnet
  hostAliases:
    - ip: "10.106.122.174"
      hostnames: [download.tensorflow.org, www.cs.toronto.edu]
""")
CACHE_RULES = parse_rules(f"""
- name: cache
  app: {KEY}
  label: ksonnet
  hostAliases:
    - hostnames: [download.tensorflow.org, www.cs.toronto.edu]
""")


def pod(*, labels=None, annotations=None, host_aliases=None, env=None, containers=1):
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "train", "namespace": "ml", "labels": {KEY: "ksonnet"} if labels is None else labels},
         "spec": {"containers": [{"name": f"c{i}", "image": "busybox"} for i in range(containers)]}}
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    if host_aliases is not None:
        p["spec"]["hostAliases"] = host_aliases
    if env is not None:
        p["spec"]["containers"][0]["env"] = env
    return p


def job(**kw):
    template = pod(**kw)
    template["metadata"].pop("name"), template["metadata"].pop("namespace")
    template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"template": {"metadata": template["metadata"], "spec": template["spec"]}}}


def apply(obj, kind="Pod", rules=RULES, cache_ip="10.0.0.9", **kw):
    result = patch_for(obj=obj, kind=kind, namespace="ml", rules=rules, cache_ip=cache_ip, **kw)
    patched = jsonpatch.apply_patch(obj, result.ops) if result.ops else copy.deepcopy(obj)
    return result, patched


def validate(obj):
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("before,after", [
    (None, [{"ip": "10.106.122.174", "hostnames": HOSTS}]),
    ([{"ip": "1.1.1.1", "hostnames": ["own.example"]}],
     [{"ip": "1.1.1.1", "hostnames": ["own.example"]}, {"ip": "10.106.122.174", "hostnames": HOSTS}]),
    ([{"ip": "10.106.122.174", "hostnames": ["own.example"]}],
     [{"ip": "10.106.122.174", "hostnames": ["own.example"] + HOSTS}]),
    ([{"ip": "10.106.122.174", "hostnames": ["www.cs.toronto.edu"]}],
     [{"ip": "10.106.122.174", "hostnames": ["www.cs.toronto.edu", "download.tensorflow.org"]}]),
    ([{"ip": "10.106.122.174"}], [{"ip": "10.106.122.174", "hostnames": HOSTS}]),
    ([], [{"ip": "10.106.122.174", "hostnames": HOSTS}]),
])
@pytest.mark.parametrize("make,kind,spec", [
    (pod, "Pod", lambda o: o["spec"]),
    (job, "Job", lambda o: o["spec"]["template"]["spec"]),
])
def test_host_aliases_are_added_appended_or_merged_into_a_valid_object(before, after, make, kind, spec):
    original = make(host_aliases=copy.deepcopy(before))
    result, patched = apply(original, kind)
    assert spec(patched)["hostAliases"] == after
    meta = patched["metadata"] if kind == "Pod" else patched["spec"]["template"]["metadata"]
    assert meta["annotations"] == {INJECTED: "dataset"}
    assert result.rules == ["dataset"] and result.warnings == []
    validate(patched)


@pytest.mark.parametrize("make,kind", [(pod, "Pod"), (job, "Job")])
@pytest.mark.parametrize("before", [None, [{"ip": "1.1.1.1", "hostnames": ["x.example"]}],
                                    [{"ip": "10.106.122.174", "hostnames": ["x.example"]}]])
def test_running_again_on_the_patched_object_adds_nothing(make, kind, before):
    _, once = apply(make(host_aliases=before), kind)
    again, twice = apply(once, kind)
    assert again.ops == [] and twice == once


def test_a_rule_without_ip_uses_the_cache_service_ip():
    _, patched = apply(pod(), rules=CACHE_RULES, cache_ip="10.96.0.42")
    assert patched["spec"]["hostAliases"] == [{"ip": "10.96.0.42", "hostnames": HOSTS}]


def test_a_rule_without_ip_and_no_known_cache_ip_is_skipped_with_a_warning():
    result, patched = apply(pod(), rules=CACHE_RULES, cache_ip=None)
    assert result.ops == [] and "hostAliases" not in patched["spec"]
    assert "cache Service IP is not known" in result.warnings[0]


@pytest.mark.parametrize("labels,annotations,namespace_rules,expect_ops", [
    ({KEY: "ksonnet"}, None, None, True),
    ({KEY: "other"}, None, None, False),
    ({}, None, None, False),
    ({"deploy-manager": "ksonnet"}, None, None, False),
    ({KEY: "ksonnet"}, {"nezha.io/inject": "false"}, None, False),
    ({KEY: "ksonnet"}, {"nezha.io/inject": "true"}, None, True),
    ({KEY: "ksonnet"}, None, ["ml"], True),
    ({KEY: "ksonnet"}, None, ["other"], False),
])
def test_rules_select_by_label_key_with_slash_namespace_and_opt_out(labels, annotations, namespace_rules,
                                                                      expect_ops):
    ns = f"\n  namespaces: {namespace_rules}" if namespace_rules else ""
    rules = parse_rules(f"- name: r\n  app: {KEY}\n  label: ksonnet{ns}\n"
                        "  hostAliases: [{ip: 10.0.0.1, hostnames: [a.example]}]\n")
    result, _ = apply(pod(labels=labels, annotations=annotations), rules=rules)
    assert bool(result.ops) is expect_ops


def test_annotation_keys_are_json_pointer_escaped():
    original = pod(annotations={"a/b~c": "1"})
    result, patched = apply(original)
    assert {"op": "add", "path": "/metadata/annotations/nezha.io~1injected", "value": "dataset"} in result.ops
    assert patched["metadata"]["annotations"] == {"a/b~c": "1", INJECTED: "dataset"}
    assert escape("a~/b") == "a~0~1b"


def test_a_hostname_the_pod_already_maps_elsewhere_is_left_to_the_pod():
    result, patched = apply(pod(host_aliases=[{"ip": "9.9.9.9", "hostnames": ["www.cs.toronto.edu"]}]))
    assert patched["spec"]["hostAliases"] == [
        {"ip": "9.9.9.9", "hostnames": ["www.cs.toronto.edu"]},
        {"ip": "10.106.122.174", "hostnames": ["download.tensorflow.org"]}]
    assert "already maps to 9.9.9.9" in result.warnings[0]


def test_two_matching_rules_for_one_ip_make_one_entry_and_name_both():
    rules = parse_rules(f"""
- {{name: a, app: {KEY}, label: ksonnet, hostAliases: [{{ip: 10.0.0.1, hostnames: [a.example]}}]}}
- {{name: b, app: {KEY}, label: ksonnet, hostAliases: [{{ip: 10.0.0.1, hostnames: [a.example, b.example]}}]}}
""")
    result, patched = apply(pod(), rules=rules)
    assert patched["spec"]["hostAliases"] == [{"ip": "10.0.0.1", "hostnames": ["a.example", "b.example"]}]
    assert patched["metadata"]["annotations"][INJECTED] == "a,b"
    assert apply(patched, rules=rules)[0].ops == []
    validate(patched)


@pytest.mark.parametrize("ip", ["10.106.122.174", "9.9.9.9"], ids=["to-the-cache", "elsewhere"])
def test_a_rule_whose_hostnames_the_pod_maps_already_injects_nothing_and_does_not_annotate(ip):
    result, patched = apply(pod(host_aliases=[{"ip": ip, "hostnames": HOSTS}]))
    assert result.ops == [] and result.rules == []
    assert "annotations" not in patched["metadata"]


def test_only_the_rules_that_added_something_are_named():
    rules = parse_rules(f"""
- {{name: mapped, app: {KEY}, label: ksonnet, hostAliases: [{{ip: 10.0.0.1, hostnames: [a.example]}}]}}
- {{name: added, app: {KEY}, label: ksonnet, hostAliases: [{{ip: 10.0.0.1, hostnames: [b.example]}}]}}
""")
    result, patched = apply(pod(host_aliases=[{"ip": "10.0.0.1", "hostnames": ["a.example"]}]), rules=rules)
    assert result.rules == ["added"] and patched["metadata"]["annotations"] == {INJECTED: "added"}


def test_a_pass_that_adds_keeps_the_rules_an_earlier_pass_recorded():
    """Reinvoked after the rules changed: the first pass's record stays and the new rule joins it."""
    rules = parse_rules(f"""
- {{name: first, app: {KEY}, label: ksonnet, hostAliases: [{{ip: 10.0.0.1, hostnames: [a.example]}}]}}
- {{name: second, app: {KEY}, label: ksonnet, hostAliases: [{{ip: 10.0.0.1, hostnames: [b.example]}}]}}
""")
    _, once = apply(pod(), rules=rules[:1])
    result, twice = apply(once, rules=rules)
    assert twice["metadata"]["annotations"] == {INJECTED: "first,second"} and result.rules == ["second"]
    assert apply(twice, rules=rules)[0].ops == []


ENV_RULES = parse_rules(f"""
- name: proxy
  app: {KEY}
  label: ksonnet
  mode: env
  hostAliases: [{{hostnames: [www.cs.toronto.edu]}}]
""")


PROXY = "http://nezha-cache.nezha.svc:80"


def env_of(container):
    return {e["name"]: e["value"] for e in container.get("env") or []}


def test_env_mode_gives_every_container_both_cases_of_both_pairs():
    original = pod(containers=2)
    original["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    result, patched = apply(original, rules=ENV_RULES, proxy_url=PROXY)
    for c in patched["spec"]["initContainers"] + patched["spec"]["containers"]:
        assert [e["name"] for e in c["env"]] == ["HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"]
        assert env_of(c)["http_proxy"] == PROXY and ".svc" in env_of(c)["no_proxy"]
    assert result.warnings == []
    assert apply(patched, rules=ENV_RULES, proxy_url=PROXY)[0].ops == []
    validate(patched)


@pytest.mark.parametrize("name", ["HTTP_PROXY", "http_proxy"])
def test_a_container_with_its_own_proxy_in_either_case_gets_no_proxy_variables(name):
    """Its proxy is its own: not even NO_PROXY is added, which would change how that proxy is used."""
    mine = [{"name": name, "value": "http://mine:3128"}]
    result, patched = apply(pod(containers=2, env=mine), rules=ENV_RULES, proxy_url=PROXY)
    first, second = patched["spec"]["containers"]
    assert first["env"] == mine
    assert env_of(second)["HTTP_PROXY"] == env_of(second)["http_proxy"] == PROXY
    assert result.warnings == [f"container 'c0' sets {name} itself; its proxy variables are left alone"]
    assert apply(patched, rules=ENV_RULES, proxy_url=PROXY)[0].ops == []
    validate(patched)


@pytest.mark.parametrize("name", ["NO_PROXY", "no_proxy"])
def test_a_container_with_its_own_no_proxy_in_either_case_keeps_it_and_gets_only_the_proxy_pair(name):
    """wget and urllib read no_proxy first: adding it would override the container's NO_PROXY."""
    mine = [{"name": name, "value": "internal.example"}]
    result, patched = apply(pod(env=mine), rules=ENV_RULES, proxy_url=PROXY)
    [c] = patched["spec"]["containers"]
    assert env_of(c) == {name: "internal.example", "HTTP_PROXY": PROXY, "http_proxy": PROXY}
    assert result.warnings == [f"container 'c0' sets {name} itself, which is kept: hosts it does not list, "
                               "cluster Services included, go to the cache proxy, which refuses hosts it does "
                               "not cache"]
    assert apply(patched, rules=ENV_RULES, proxy_url=PROXY)[0].ops == []
    validate(patched)


def test_a_container_with_env_from_is_left_alone_with_a_warning():
    """envFrom may set the proxy variables from a ConfigMap or Secret the webhook cannot read."""
    original = pod(containers=2)
    original["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "proxy-settings"}}]
    result, patched = apply(original, rules=ENV_RULES, proxy_url=PROXY)
    first, second = patched["spec"]["containers"]
    assert "env" not in first and env_of(second)["HTTP_PROXY"] == PROXY
    assert result.warnings == ["container 'c0' has envFrom, which may set proxy variables the webhook cannot "
                               "see; its proxy variables are left alone"]
    assert patched["spec"]["hostAliases"][0]["hostnames"] == ["www.cs.toronto.edu"]
    validate(patched)


def test_two_env_rules_give_a_container_its_variables_once():
    second = parse_rules(f"""
- {{name: proxy2, app: {KEY}, label: ksonnet, mode: env, hostAliases: [{{hostnames: [yann.lecun.com]}}]}}
""")
    result, patched = apply(pod(), rules=ENV_RULES + second, proxy_url=PROXY)
    assert [e["name"] for e in patched["spec"]["containers"][0]["env"]] == [
        "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"]
    validate(patched)


SECOND_ENV_RULE = parse_rules(f"""
- {{name: proxy2, app: {KEY}, label: ksonnet, mode: env, hostAliases: [{{hostnames: [yann.lecun.com]}}]}}
""")


def many(*, init, containers, env=None):
    """A pod with `init` init containers and `containers` containers, each with `env` when given."""
    original = pod(containers=containers)
    original["spec"]["initContainers"] = [{"name": f"i{i}", "image": "busybox"} for i in range(init)]
    for c in original["spec"]["initContainers"] + original["spec"]["containers"]:
        if env is not None:
            c["env"] = copy.deepcopy(env)
    return original


def env_ops(group, i, *, own_env):
    """What env mode adds to one container: a new env list, or four appends to the container's own."""
    variables = [{"name": "HTTP_PROXY", "value": PROXY}, {"name": "http_proxy", "value": PROXY},
                 {"name": "NO_PROXY", "value": DEFAULT_NO_PROXY}, {"name": "no_proxy", "value": DEFAULT_NO_PROXY}]
    base = f"/spec/{group}/{i}/env"
    if own_env:
        return [{"op": "add", "path": f"{base}/-", "value": v} for v in variables]
    return [{"op": "add", "path": base, "value": variables}]


@pytest.mark.parametrize("own_env", [False, True], ids=["no-env", "own-env"])
@pytest.mark.parametrize("init,containers", [(0, 1), (1, 10), (10, 100), (MAX_CONTAINERS - 600, 600)],
                         ids=["1", "11", "110", "at-the-bound"])
def test_env_mode_gives_n_containers_exactly_their_operations_a_fixed_number_each(init, containers, own_env):
    """Counted, not timed: one op per container (four with an env list of its own), once for both rules."""
    original = many(init=init, containers=containers, env=[{"name": "A", "value": "1"}] if own_env else None)
    result = patch_for(obj=original, kind="Pod", namespace="ml", rules=ENV_RULES + SECOND_ENV_RULE,
                       cache_ip="10.0.0.9", proxy_url=PROXY)
    assert result.ops == [
        {"op": "add", "path": "/spec/hostAliases", "value": [{"ip": "10.0.0.9", "hostnames": ["www.cs.toronto.edu"]}]},
        *[op for i in range(init) for op in env_ops("initContainers", i, own_env=own_env)],
        *[op for i in range(containers) for op in env_ops("containers", i, own_env=own_env)],
        {"op": "add", "path": "/spec/hostAliases/0/hostnames/-", "value": "yann.lecun.com"},  # the second rule's
        {"op": "add", "path": "/metadata/annotations", "value": {INJECTED: "proxy,proxy2"}},
    ]
    assert len(result.ops) == (4 if own_env else 1) * (init + containers) + 3
    assert result.warnings == []


class ReadCountingOps(list):
    """An ops list that counts the operations read back out of it."""

    reads = 0

    def __iter__(self):
        for op in super().__iter__():
            self.reads += 1
            yield op

    def __contains__(self, op):
        self.reads += len(self)
        return super().__contains__(op)


@dataclasses.dataclass
class ReadCountingPatch(Patch):
    ops: list = dataclasses.field(default_factory=ReadCountingOps)


def test_env_mode_reads_back_no_more_operations_than_it_makes(monkeypatch):
    """The quadratic case (issue 14): each container used to rescan every op made so far."""
    monkeypatch.setattr(webhook.patch, "Patch", ReadCountingPatch)
    result = patch_for(obj=many(init=200, containers=800, env=[]), kind="Pod", namespace="ml",
                       rules=ENV_RULES + SECOND_ENV_RULE, cache_ip="10.0.0.9", proxy_url=PROXY)
    assert len(result.ops) == 4 * 1000 + 3
    assert result.ops.reads <= len(result.ops)


def test_two_env_rules_warn_about_a_container_once():
    original = pod(containers=2)
    original["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "proxy-settings"}}]
    result, _ = apply(original, rules=ENV_RULES + SECOND_ENV_RULE, proxy_url=PROXY)
    assert result.warnings == ["container 'c0' has envFrom, which may set proxy variables the webhook cannot "
                               "see; its proxy variables are left alone"]


@pytest.mark.parametrize("make,kind,where", [(pod, "Pod", "/spec"), (job, "Job", "/spec/template/spec")])
def test_env_mode_declines_a_pod_over_the_container_bound_naming_the_count(make, kind, where):
    """A PatchError, so the review allows the pod unpatched with this warning: the webhook fails open."""
    original = make(containers=MAX_CONTAINERS - 4)
    spec = original["spec"] if kind == "Pod" else original["spec"]["template"]["spec"]
    spec["initContainers"] = [{"name": f"i{i}", "image": "busybox"} for i in range(5)]
    with pytest.raises(TooManyContainers) as e:
        patch_for(obj=original, kind=kind, namespace="ml", rules=RULES + ENV_RULES, cache_ip="10.0.0.9",
                  proxy_url=PROXY)
    assert isinstance(e.value, PatchError)
    assert str(e.value) == (f"{where} has {MAX_CONTAINERS + 1} containers and init containers, more than the "
                            f"{MAX_CONTAINERS} that mode env patches")


@pytest.mark.parametrize("rules,proxy_url", [(RULES, PROXY), (ENV_RULES, None)],
                         ids=["hosts-mode", "env-mode-without-proxy-url"])
def test_the_container_bound_applies_only_where_containers_are_patched(rules, proxy_url):
    """Hosts mode, and env mode with no proxy URL, never look at the containers, so any number is fine."""
    result, patched = apply(pod(containers=MAX_CONTAINERS + 1), rules=rules, proxy_url=proxy_url)
    assert patched["spec"]["hostAliases"][0]["hostnames"][-1] == "www.cs.toronto.edu"
    assert not any("/containers/" in op["path"] for op in result.ops)


@pytest.mark.parametrize("host,direct", [
    ("nezha-cache.nezha.svc", True), ("redis.ml.svc.cluster.local", True), ("kubernetes.default", True),
    ("localhost", True), ("127.0.0.1", True),
    ("www.cs.toronto.edu", False), ("download.tensorflow.org", False),
])
def test_the_default_no_proxy_keeps_service_names_and_loopback_direct_but_not_dataset_hosts(host, direct):
    """Checked with urllib's own matcher, which is suffix-based as wget's is."""
    assert bool(urllib.request.proxy_bypass_environment(host, proxies={"no": DEFAULT_NO_PROXY})) is direct


@pytest.mark.parametrize("ip", ["10.96.0.1", "10.244.3.7", "172.16.0.1", "172.31.255.254", "192.168.49.2"])
def test_the_default_no_proxy_keeps_the_private_ranges_direct_for_clients_that_match_cidrs(ip):
    cidrs = [ipaddress.ip_network(e) for e in DEFAULT_NO_PROXY.split(",") if "/" in e]
    assert any(ipaddress.ip_address(ip) in net for net in cidrs)


def test_the_default_no_proxy_is_what_env_mode_injects():
    _, patched = apply(pod(), rules=ENV_RULES, proxy_url=PROXY)
    assert env_of(patched["spec"]["containers"][0])["NO_PROXY"] == DEFAULT_NO_PROXY


@pytest.mark.parametrize("value", ["[.svc, internal.example]", "'.svc, internal.example'"])
def test_a_rule_no_proxy_replaces_the_setting_for_its_pods(value):
    rules = parse_rules(f"- {{name: p, app: {KEY}, label: ksonnet, mode: env, noProxy: {value}, "
                        "hostAliases: [{hostnames: [www.cs.toronto.edu]}]}")
    _, patched = apply(pod(), rules=rules, proxy_url=PROXY, no_proxy="from.setting")
    env = env_of(patched["spec"]["containers"][0])
    assert env["NO_PROXY"] == env["no_proxy"] == ".svc,internal.example"


def test_without_a_rule_no_proxy_the_setting_is_used():
    _, patched = apply(pod(), rules=ENV_RULES, proxy_url=PROXY, no_proxy="from.setting")
    assert env_of(patched["spec"]["containers"][0])["no_proxy"] == "from.setting"


@pytest.mark.parametrize("obj,kind,why", [
    (pod(), "ConfigMap", "not one the webhook patches"),
    ({"kind": "Pod", "metadata": {}}, "Pod", "no pod spec"),
    ({"kind": "Job", "spec": {"template": None}}, "Job", "no pod spec"),
    (pod(host_aliases="10.0.0.1 a.example"), "Pod", "hostAliases is not a list"),
])
def test_objects_that_cannot_be_patched_raise_patch_error(obj, kind, why):
    with pytest.raises(PatchError, match=why):
        patch_for(obj=obj, kind=kind, namespace="ml", rules=RULES, cache_ip=None)


def test_a_job_template_without_metadata_gets_metadata_with_the_annotation():
    original = job()
    del original["spec"]["template"]["metadata"]
    original["metadata"]["labels"] = {KEY: "ksonnet"}
    _, patched = apply(original, "Job")
    assert patched["spec"]["template"]["metadata"] == {"annotations": {INJECTED: "dataset"}}
    validate(patched)


def test_the_original_nezha_configmap_parses_unchanged():
    rules = parse_rules("""
- name: dataset
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases:
    - ip: "10.106.122.174"
      hostnames:
        - "download.tensorflow.org"
        - "yann.lecun.com"
        - "www.cs.toronto.edu"
        - "storage.googleapis.com"
        - "images.cocodataset.org"
""")
    assert rules[0].name == "dataset" and rules[0].label_key == KEY and rules[0].mode == "hosts"
    assert rules[0].host_aliases[0].ip == "10.106.122.174" and len(rules[0].host_aliases[0].hostnames) == 5


@pytest.mark.parametrize("text,why", [
    ("{a: [", "not valid YAML"),
    ("name: x", "must be a list"),
    ("- just a string", "rule #0: must be a mapping"),
    ("- {app: k, label: v, hostAliases: [{hostnames: [a.b]}]}", "rule #0: name"),
    ("- {name: r, label: v, hostAliases: [{hostnames: [a.b]}]}", "rule 'r': app"),
    ("- {name: r, app: k, label: 1, hostAliases: [{hostnames: [a.b]}]}", "rule 'r': label must be a string"),
    ("- {name: r, app: k, label: v}", "rule 'r': hostAliases must be"),
    ("- {name: r, app: k, label: v, hostAliases: [{ip: 300.1.1.1, hostnames: [a.b]}]}",
     r"rule 'r': hostAliases\[0\].ip"),
    ("- {name: r, app: k, label: v, hostAliases: [{hostnames: []}]}", r"hostAliases\[0\].hostnames"),
    ("- {name: r, app: k, label: v, hostAliases: [{hostnames: ['bad host']}]}", "not a hostname"),
    ("- {name: r, app: k, label: v, mode: dns, hostAliases: [{hostnames: [a.b]}]}", "rule 'r': mode"),
    ("- {name: r, app: k, label: v, namespaces: ml, hostAliases: [{hostnames: [a.b]}]}", "rule 'r': namespaces"),
    ("- {name: r, app: k, label: v, labels: x, hostAliases: [{hostnames: [a.b]}]}", "unknown field 'labels'"),
    ("- {name: r, app: k, label: v, noProxy: [.svc], hostAliases: [{hostnames: [a.b]}]}",
     "rule 'r': noProxy applies only to mode: env"),
    ("- {name: r, app: k, label: v, mode: env, noProxy: ['a b'], hostAliases: [{hostnames: [a.b]}]}",
     "rule 'r': noProxy has 'a b'"),
    ("- {name: r, app: k, label: v, mode: env, noProxy: 5, hostAliases: [{hostnames: [a.b]}]}",
     "rule 'r': noProxy must be a list"),
    ("- {name: r, app: k, label: v, hostAliases: [{hostnames: [a.b]}]}\n"
     "- {name: r, app: k, label: w, hostAliases: [{hostnames: [a.b]}]}", "rule 'r': name is used twice"),
])
def test_bad_rules_are_refused_naming_the_rule_and_field(text, why):
    with pytest.raises(RuleError, match=why):
        parse_rules(text)


def test_an_opt_out_annotation_with_an_unknown_value_warns_and_injects():
    result, patched = apply(pod(annotations={"nezha.io/inject": "no"}))
    assert patched["spec"]["hostAliases"][0]["ip"] == "10.106.122.174"
    assert result.warnings == ['annotation nezha.io/inject is \'no\'; expected "true" or "false"; treated as "true"']


@pytest.mark.parametrize("kind,api_version,wrap", [
    ("Deployment", "apps/v1", lambda t: {"replicas": 1, "selector": {"matchLabels": {"app": "x"}}, "template": t}),
    ("StatefulSet", "apps/v1", lambda t: {"serviceName": "x", "selector": {"matchLabels": {"app": "x"}},
                                          "template": t}),
    ("CronJob", "batch/v1", lambda t: {"schedule": "@daily", "jobTemplate": {"spec": {"template": t}}}),
])
def test_workload_templates_are_patched_at_their_pod_template(kind, api_version, wrap):
    template = {"metadata": {"labels": {KEY: "ksonnet", "app": "x"}},
                "spec": {"restartPolicy": "OnFailure" if kind == "CronJob" else "Always",
                         "containers": [{"name": "c", "image": "busybox"}]}}
    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "w", "namespace": "ml"},
           "spec": wrap(template)}
    result, patched = apply(obj, kind)
    spec = patched["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else patched["spec"]
    assert spec["template"]["spec"]["hostAliases"] == [{"ip": "10.106.122.174", "hostnames": HOSTS}]
    assert spec["template"]["metadata"]["annotations"] == {INJECTED: "dataset"}
    validate(patched)
    assert apply(patched, kind)[0].ops == []


def with_value(obj, path, value):
    """`obj` with `value` put at `path` (keys and list indexes); unchanged when the path is not there."""
    def has(node, step):
        return isinstance(node, dict) and isinstance(step, str) \
            or isinstance(node, list) and isinstance(step, int) and step < len(node)

    node = obj
    for step in path[:-1]:
        if not has(node, step) or isinstance(node, dict) and step not in node:
            return obj
        node = node[step]
    if has(node, path[-1]):
        node[path[-1]] = value
    return obj


def messy_pod():
    p = pod(host_aliases=[{"ip": "10.106.122.174", "hostnames": ["www.cs.toronto.edu"]}],
            annotations={"a": "b"}, env=[{"name": "A", "value": "1"}])
    p["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "env": [{"name": "B", "value": "2"}]}]
    return p


WRONG = [  # (where, value, message)
    (("spec", "hostAliases", 0, "hostnames"), [["x"]],
     "/spec/hostAliases/0/hostnames/0 is a list, not a hostname"),
    (("spec", "hostAliases", 0, "hostnames"), "x.example",
     "/spec/hostAliases/0/hostnames is the string 'x.example', not a list of hostnames"),
    (("spec", "hostAliases", 0, "ip"), ["10.0.0.1"], "/spec/hostAliases/0/ip is a list, not an IP address"),
    (("spec", "hostAliases", 0), "10.0.0.1 x.example",
     "/spec/hostAliases/0 is the string '10.0.0.1 x.example', not a hostAliases entry"),
    (("spec", "hostAliases"), {"ip": "10.0.0.1"}, "/spec/hostAliases is not a list of entries: it is a mapping"),
    (("spec", "containers", 0, "env", 0, "name"), ["x"],
     "/spec/containers/0/env/0/name is a list, not a variable name"),
    (("spec", "containers", 0, "env", 0), "A=1", "/spec/containers/0/env/0 is the string 'A=1', not a variable"),
    (("spec", "containers", 0, "env"), "HTTP_PROXY=x",
     "/spec/containers/0/env is the string 'HTTP_PROXY=x', not a list"),
    (("spec", "containers", 0, "envFrom"), {"configMapRef": {"name": "x"}},
     "/spec/containers/0/envFrom is a mapping, not a list"),
    (("spec", "initContainers", 0), 7, "/spec/initContainers/0 is a number, not a container"),
    (("spec", "containers"), {"name": "c0"}, "/spec/containers is a mapping, not a list"),
    (("metadata", "annotations"), ["a=b"], "/metadata/annotations is a list, not a mapping"),
]


@pytest.mark.parametrize("where,value,message", WRONG, ids=["/".join(map(str, w[0])) + ":" + type(w[1]).__name__
                                                             for w in WRONG])
def test_a_field_of_the_wrong_type_raises_patch_error_naming_its_pointer(where, value, message):
    """Never a TypeError, and never a patch that writes over the user's malformed value."""
    obj = with_value(messy_pod(), where, value)
    with pytest.raises(PatchError) as e:
        patch_for(obj=obj, kind="Pod", namespace="ml", rules=RULES + ENV_RULES, cache_ip="10.0.0.9",
                  proxy_url=PROXY)
    assert str(e.value) == message


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                max_size=3),
                    max_leaves=8)
PLACES = [("spec",), ("spec", "hostAliases"), ("spec", "hostAliases", 0), ("spec", "hostAliases", 0, "ip"),
          ("spec", "hostAliases", 0, "hostnames"), ("spec", "hostAliases", 0, "hostnames", 0),
          ("spec", "containers"), ("spec", "containers", 0), ("spec", "containers", 0, "name"),
          ("spec", "containers", 0, "env"), ("spec", "containers", 0, "env", 0),
          ("spec", "containers", 0, "env", 0, "name"), ("spec", "containers", 0, "envFrom"),
          ("spec", "initContainers"), ("spec", "initContainers", 0, "env"), ("metadata",),
          ("metadata", "labels"), ("metadata", "annotations"), ("metadata", "annotations", INJECTED),
          ("metadata", "annotations", "nezha.io/inject")]


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(changes=st.lists(st.tuples(st.sampled_from(PLACES), JSON), min_size=1, max_size=3),
                  rules=st.sampled_from([RULES, CACHE_RULES, ENV_RULES, RULES + ENV_RULES]))
def test_any_value_anywhere_gives_a_patch_that_applies_once_or_a_patch_error(changes, rules):
    obj = messy_pod()
    for where, value in changes:
        obj = with_value(obj, where, value)
    try:
        result = patch_for(obj=obj, kind="Pod", namespace="ml", rules=rules, cache_ip="10.0.0.9", proxy_url=PROXY)
    except PatchError:
        return
    patched = jsonpatch.apply_patch(obj, result.ops)
    again = patch_for(obj=patched, kind="Pod", namespace="ml", rules=rules, cache_ip="10.0.0.9", proxy_url=PROXY)
    assert again.ops == []


# -- tls: true (issue 13): matched pods trust the cache's certificates -------------

TLS_RULES = parse_rules(f"""
- name: secure
  app: {KEY}
  label: ksonnet
  tls: true
  hostAliases:
    - hostnames: [storage.googleapis.com]
""")
BUNDLE = "/etc/nezha/ca/ca-bundle.crt"


def test_a_tls_rule_mounts_the_ca_bundle_in_every_container_and_sets_each_clients_variable():
    original = pod(containers=2)
    original["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    result, patched = apply(original, rules=TLS_RULES)
    spec = patched["spec"]
    assert spec["volumes"] == [{"name": "nezha-ca", "configMap": {"name": "nezha-ca"}}]
    for c in spec["initContainers"] + spec["containers"]:
        assert c["volumeMounts"] == [{"name": "nezha-ca", "mountPath": "/etc/nezha/ca", "readOnly": True}]
        env = env_of(c)
        assert {env[v] for v in ("SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "AWS_CA_BUNDLE",
                                 "GIT_SSL_CAINFO")} == {BUNDLE}
        assert env["NODE_EXTRA_CA_CERTS"] == "/etc/nezha/ca/ca.crt"  # Node adds it to its roots: the CA alone
        assert env["WGETRC"] == "/etc/nezha/ca/wgetrc" and env["BOTO_CONFIG"] == "/etc/nezha/ca/boto.cfg"
    assert result.warnings == [] and result.rules == ["secure"]
    validate(patched)
    assert apply(patched, rules=TLS_RULES)[0].ops == []  # reinvocation adds nothing


def test_a_variable_the_container_sets_is_kept_with_a_warning_naming_it_and_nothing_is_duplicated():
    original = pod(env=[{"name": "REQUESTS_CA_BUNDLE", "value": "/my/roots.pem"}])
    result, patched = apply(original, rules=TLS_RULES)
    names = [e["name"] for e in patched["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names))  # a duplicate env name is an error under server-side apply
    assert env_of(patched["spec"]["containers"][0])["REQUESTS_CA_BUNDLE"] == "/my/roots.pem"
    assert any("sets REQUESTS_CA_BUNDLE itself, which is kept" in w for w in result.warnings)
    validate(patched)


def test_a_pod_with_its_own_volumes_and_mounts_keeps_them_and_gains_the_bundle():
    original = pod()
    original["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    original["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    _, patched = apply(original, rules=TLS_RULES)
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["data", "nezha-ca"]
    assert [m["mountPath"] for m in patched["spec"]["containers"][0]["volumeMounts"]] == ["/data", "/etc/nezha/ca"]
    validate(patched)


def test_tls_and_env_rules_on_one_pod_share_each_env_list_without_duplicates():
    both = parse_rules(f"""
- name: proxy
  app: {KEY}
  label: ksonnet
  mode: env
  hostAliases: [{{hostnames: [www.cs.toronto.edu]}}]
- name: secure
  app: {KEY}
  label: ksonnet
  tls: true
  hostAliases: [{{hostnames: [storage.googleapis.com]}}]
""")
    for rules in (both, tuple(reversed(both))):
        result, patched = apply(pod(), rules=rules, proxy_url=PROXY)
        names = [e["name"] for e in patched["spec"]["containers"][0]["env"]]
        assert len(names) == len(set(names)) and {"HTTP_PROXY", "SSL_CERT_FILE"} <= set(names)
        assert apply(patched, rules=rules, proxy_url=PROXY)[0].ops == []
        validate(patched)


def test_envfrom_containers_still_get_the_ca_variables_with_a_warning():
    original = pod()
    original["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    result, patched = apply(original, rules=TLS_RULES)
    assert env_of(patched["spec"]["containers"][0])["SSL_CERT_FILE"] == BUNDLE
    assert any("has envFrom" in w and "takes precedence over the same names" in w for w in result.warnings)


def test_tls_must_be_a_boolean():
    with pytest.raises(RuleError, match="rule 'x': tls must be true or false, got 'yes'"):
        parse_rules(f"""
- name: x
  app: {KEY}
  label: v
  tls: "yes"
  hostAliases: [{{hostnames: [a.example]}}]
""")


S3_RULES = parse_rules(f"""
- name: s3
  app: {KEY}
  label: ksonnet
  tls: true
  hostAliases:
    - hostnames: [s3.amazonaws.com, datasets.s3.amazonaws.com]
""")


def test_a_tls_rule_aliasing_s3s_service_name_points_aws_sdks_at_it():
    result, patched = apply(pod(containers=2), rules=S3_RULES)
    for c in patched["spec"]["containers"]:
        assert env_of(c)["AWS_ENDPOINT_URL_S3"] == "https://s3.amazonaws.com"
    assert apply(patched, rules=S3_RULES)[0].ops == []
    validate(patched)


@pytest.mark.parametrize("own", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
def test_an_endpoint_the_container_chose_is_kept(own):
    _, patched = apply(pod(env=[{"name": own, "value": "https://minio.internal"}]), rules=S3_RULES)
    env = env_of(patched["spec"]["containers"][0])
    assert env[own] == "https://minio.internal" and (own == "AWS_ENDPOINT_URL_S3" or "AWS_ENDPOINT_URL_S3" not in env)
    assert env["AWS_CA_BUNDLE"] == BUNDLE  # still trusts the cache


def test_no_endpoint_for_buckets_named_alone_for_envfrom_or_without_tls():
    buckets_only = parse_rules(f"""
- name: buckets
  app: {KEY}
  label: ksonnet
  tls: true
  hostAliases: [{{hostnames: [datasets.s3.amazonaws.com]}}]
""")
    assert "AWS_ENDPOINT_URL_S3" not in env_of(apply(pod(), rules=buckets_only)[1]["spec"]["containers"][0])
    original = pod()
    original["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "aws"}}]
    assert "AWS_ENDPOINT_URL_S3" not in env_of(apply(original, rules=S3_RULES)[1]["spec"]["containers"][0])
    plain = parse_rules(f"""
- name: plain
  app: {KEY}
  label: ksonnet
  hostAliases: [{{hostnames: [s3.amazonaws.com]}}]
""")
    assert apply(pod(), rules=plain)[1]["spec"]["containers"][0].get("env") is None  # never to plain HTTP
