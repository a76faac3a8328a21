"""Pure: the webhook's rules, from the ConfigMap's `config` value.

Rules keep the original Nezha ConfigMap format, so old configs work as they
are::

    - name: dataset
      app: app.kubernetes.io/deploy-manager   # label key
      label: ksonnet                          # label value
      hostAliases:
        - ip: "10.106.122.174"                # optional: else the cache Service IP
          hostnames: [www.cs.toronto.edu, yann.lecun.com]
      namespaces: [ml]                        # optional, new
      mode: env                               # optional, new
      noProxy: [localhost, .svc]              # optional, new (mode env only)
      deployment: sidecar                     # optional, new: centralized (default) | sidecar

A rule that cannot be used raises RuleError naming the rule and the field;
what a matching rule does to a pod is `webhook/patch.py`'s.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

import yaml

from nezha.errors import ConfigError
from webhook import sidecar as sc

MODES = ("hosts", "env")

_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


class RuleError(ConfigError):
    """A rule that cannot be used; the message names the rule and the field."""


@dataclass(frozen=True)
class HostAlias:
    ip: str | None  # None: the cache Service ClusterIP, learned at run time
    hostnames: tuple[str, ...]


@dataclass(frozen=True)
class Rule:
    name: str
    label_key: str
    label_value: str
    host_aliases: tuple[HostAlias, ...]
    namespaces: tuple[str, ...] | None = None
    mode: str = "hosts"
    no_proxy: str | None = None  # mode env: NO_PROXY for this rule; None: the setting's
    # Matched pods trust the cache's certificates for HTTPS (docs/https.md): the
    # Nezha CA bundle mounted in every container and each client's variable set.
    tls: bool = False
    # Where the cache the pod uses runs (webhook/sidecar.py): the cluster
    # Service, or a sidecar in the pod whose parent is the cluster.
    deployment: str = sc.CENTRALIZED

    @property
    def needs_cache_ip(self) -> bool:
        """True when some alias leaves `ip` out, so the cache Service IP must be known."""
        return any(a.ip is None for a in self.host_aliases)

    def matches(self, *, labels: dict[str, str], namespace: str | None) -> bool:
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return labels.get(self.label_key) == self.label_value


def parse_rules(text: str) -> tuple[Rule, ...]:
    """Rules from the ConfigMap's `config` value (YAML or JSON)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RuleError(f"rules are not valid YAML: {str(e).splitlines()[0]}") from e
    return rules_from(data)


def rules_from(data: Any) -> tuple[Rule, ...]:
    if data is None:
        return ()
    if isinstance(data, dict) and "rules" in data:
        data = data["rules"]
    if not isinstance(data, list):
        raise RuleError(f"rules must be a list of rules, got {type(data).__name__}")
    rules = tuple(_rule(i, r) for i, r in enumerate(data))
    names = [r.name for r in rules]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuleError(f"rule {dup[0]!r}: name is used twice")
    return rules


def _rule(i: int, raw: Any) -> Rule:
    if not isinstance(raw, dict):
        raise RuleError(f"rule #{i}: must be a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise RuleError(f"rule #{i}: name must be a non-empty string, got {name!r}")
    where = f"rule {name!r}"
    unknown = sorted(set(raw) - {"name", "app", "label", "hostAliases", "namespaces", "mode", "noProxy", "tls",
                                  "deployment"})
    if unknown:
        raise RuleError(f"{where}: unknown field {unknown[0]!r}")
    key, value = raw.get("app"), raw.get("label")
    if not isinstance(key, str) or not key:
        raise RuleError(f"{where}: app (the label key) must be a non-empty string, got {key!r}")
    if isinstance(value, (int, float, bool)):
        raise RuleError(f"{where}: label must be a string, got {value!r}; quote it")
    if not isinstance(value, str):
        raise RuleError(f"{where}: label (the label value) must be a string, got {value!r}")
    aliases = raw.get("hostAliases")
    if not isinstance(aliases, list) or not aliases:
        raise RuleError(f"{where}: hostAliases must be a non-empty list, got {aliases!r}")
    parsed = tuple(_alias(where, j, a) for j, a in enumerate(aliases))
    namespaces = raw.get("namespaces")
    if namespaces is not None:
        if not isinstance(namespaces, list) or not all(isinstance(n, str) and n for n in namespaces):
            raise RuleError(f"{where}: namespaces must be a list of names, got {namespaces!r}")
        namespaces = tuple(namespaces)
    mode = raw.get("mode", "hosts")
    if mode not in MODES:
        raise RuleError(f"{where}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    no_proxy = _no_proxy(where, raw.get("noProxy"))
    if no_proxy is not None and mode != "env":
        raise RuleError(f"{where}: noProxy applies only to mode: env, and mode is {mode}")
    tls = raw.get("tls", False)
    if not isinstance(tls, bool):
        raise RuleError(f"{where}: tls must be true or false, got {tls!r}")
    deployment = raw.get("deployment", sc.CENTRALIZED)
    if deployment not in sc.DEPLOYMENTS:
        raise RuleError(f"{where}: deployment must be one of {', '.join(sc.DEPLOYMENTS)}, got {deployment!r}")
    return Rule(name=name, label_key=key, label_value=value, host_aliases=parsed,
                namespaces=namespaces, mode=mode, no_proxy=no_proxy, tls=tls, deployment=deployment)


def _no_proxy(where: str, raw: Any) -> str | None:
    """`noProxy` as a list or a comma-separated string -> the NO_PROXY value; None when absent."""
    if raw is None:
        return None
    entries = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(entries, list) or not entries:
        raise RuleError(f"{where}: noProxy must be a list of hosts, domains or CIDRs, got {raw!r}")
    for e in entries:
        if not isinstance(e, str) or not e.strip() or any(c.isspace() or c == "," for c in e.strip()):
            raise RuleError(f"{where}: noProxy has {e!r}, which is not a host, domain or CIDR")
    return ",".join(e.strip() for e in entries)


def _alias(where: str, j: int, raw: Any) -> HostAlias:
    if not isinstance(raw, dict):
        raise RuleError(f"{where}: hostAliases[{j}] must be a mapping, got {raw!r}")
    ip = raw.get("ip")
    if ip is not None:
        try:
            ipaddress.ip_address(str(ip))
        except ValueError:
            raise RuleError(f"{where}: hostAliases[{j}].ip is not an IP address: {ip!r}") from None
        ip = str(ip)
    names = raw.get("hostnames")
    if not isinstance(names, list) or not names:
        raise RuleError(f"{where}: hostAliases[{j}].hostnames must be a non-empty list, got {names!r}")
    for h in names:
        if not isinstance(h, str) or not _HOSTNAME_RE.match(h):
            raise RuleError(f"{where}: hostAliases[{j}].hostnames has {h!r}, which is not a hostname")
    return HostAlias(ip=ip, hostnames=tuple(dict.fromkeys(h.lower() for h in names)))
