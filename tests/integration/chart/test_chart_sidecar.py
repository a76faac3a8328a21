"""The chart's sidecar values (webhook.sidecar) reach the webhook as its settings file, and what the webhook then
makes of a labelled pod is a valid pod for Kubernetes 1.35."""

from __future__ import annotations

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from nezha.config import WebhookSettings, load
from tests.integration.chart.render import CHART, RenderError, find, render
from webhook import sidecar as sc
from webhook.patch import patch_for
from webhook.rules import parse_rules
from webhook.server import sidecar_config

SIDECAR_VALUES = CHART / "ci" / "sidecar-values.yaml"


def webhook_settings(objects, tmp_path) -> WebhookSettings:
    """The settings the webhook pod reads: its --config names the mounted settings ConfigMap's key."""
    deployment = find(objects, "Deployment", "nezha-webhook")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--config="))
    mount = next(m for m in container["volumeMounts"] if config.startswith(m["mountPath"] + "/"))
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    data = find(objects, "ConfigMap", volume["configMap"]["name"])["data"]
    path = tmp_path / "settings.yaml"
    path.write_text(data[config[len(mount["mountPath"]) + 1:]])
    return load(WebhookSettings, config_file=path)


def test_the_sidecar_values_reach_the_webhooks_settings(tmp_path):
    objects = render(values=[SIDECAR_VALUES])
    config = sidecar_config(webhook_settings(objects, tmp_path), (1, 35))
    assert config.image == "registry.example/nezha:0.2.0" and config.pull_policy == "Always"
    assert config.size == "40Gi" and config.by_annotation is False
    assert config.resources == {"requests": {"cpu": "200m", "memory": "160Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    # Where a sidecar that cannot reach the cluster goes: the chart's upstreams, as the nodes have them.
    assert config.origins == {"www.cs.toronto.edu": "http://www.cs.toronto.edu",
                              "images.cocodataset.org": "http://mirror.example.org"}
    assert config.parent == "http://nezha-cache.nezha.svc:80"


def test_by_default_the_sidecar_runs_the_charts_own_image_and_pods_may_choose_it(tmp_path):
    config = sidecar_config(webhook_settings(render(), tmp_path), (1, 35))
    assert config.image == f"nezha:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    assert config.by_annotation is True and config.size == "10Gi"


def test_a_settings_change_rolls_the_webhook_pods():
    def checksum(**kw):
        deployment = find(render(**kw), "Deployment", "nezha-webhook")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/settings"]

    assert checksum() != checksum(sets=["webhook.sidecar.size=20Gi"])


def test_the_rendered_rules_and_settings_give_a_labelled_pod_a_valid_native_sidecar(tmp_path):
    objects = render(values=[SIDECAR_VALUES])
    rules = parse_rules(find(objects, "ConfigMap", "nezha-webhook-rules")["data"]["config"])
    assert {r.name: r.deployment for r in rules} == {"epochs": "sidecar", "once": "centralized"}
    config = sidecar_config(webhook_settings(objects, tmp_path), (1, 35))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "labels": {"nezha.io/cache": "sidecar"}},
           "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "train", "image": "busybox", "command": ["wget", "http://x"]}]}}
    result = patch_for(obj=pod, kind="Pod", namespace="ml", rules=rules, cache_ip="10.96.0.10", sidecar=config)
    patched = jsonpatch.apply_patch(pod, result.ops)
    kubernetes_validate.validate(patched, "1.35.0", strict=True)
    (side,) = patched["spec"]["initContainers"]
    assert side["image"] == "registry.example/nezha:0.2.0" and side["restartPolicy"] == "Always"
    assert {"name": sc.VOLUME, "emptyDir": {"sizeLimit": "40Gi"}} in patched["spec"]["volumes"]
    env = {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]}
    assert env["http_proxy"] == "http://127.0.0.1:80"  # mode env composes: the proxy is the sidecar


@pytest.mark.parametrize("sets,field", [
    (["webhook.sidecar.size=512Mi"], "/webhook/sidecar/size"),
    (["webhook.sidecar.size=lots"], "/webhook/sidecar/size"),
    (["webhook.sidecar.byAnnotation=maybe"], "/webhook/sidecar/byAnnotation"),
    (["webhook.sidecar.image.pullPolicy=Sometimes"], "/webhook/sidecar/image/pullPolicy"),
    (["webhook.sidecar.sise=10Gi"], "sise"),
    (["webhook.rules[0].name=a", "webhook.rules[0].app=k", "webhook.rules[0].label=v",
      "webhook.rules[0].hostAliases[0].hostnames[0]=h.example", "webhook.rules[0].deployment=pod"],
     "/webhook/rules/0/deployment"),
])
def test_a_bad_sidecar_value_is_refused_with_its_field_named(sets, field):
    with pytest.raises(RenderError) as e:
        render(sets=sets)
    assert field in str(e.value)


def test_the_sidecar_the_webhook_makes_from_the_charts_settings_runs_a_command_nezha_takes(tmp_path):
    """Every flag of the sidecar's `nezha cache` line exists (--parent is issue-23a's), and it is the node
    described: loopback listeners, the cluster Service as parent, the chart's upstreams, a capacity under the
    volume."""
    from nezha.cli import build_parser

    objects = render(values=[SIDECAR_VALUES])
    config = sidecar_config(webhook_settings(objects, tmp_path), (1, 35))
    side = sc.container(config=config, hosts=["www.cs.toronto.edu", "images.cocodataset.org"], size=config.size)
    try:
        args = build_parser().parse_args(side["args"])
    except SystemExit:
        pytest.fail(f"nezha {' '.join(side['args'])} does not parse")
    assert (args.listen, args.tls_listen, args.parent) == ("127.0.0.1:80", "127.0.0.1:443",
                                                           "http://nezha-cache.nezha.svc:80")
    assert args.origins == ["www.cs.toronto.edu=http://www.cs.toronto.edu",
                            "images.cocodataset.org=http://mirror.example.org"]
    assert int(args.capacity) == 36 * 1024 ** 3  # 40Gi less a tenth
