"""Pure core of the webhook: rules and pod -> JSON-patch operations.

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

The patch is computed against the object as it is, so running it again on
the patched object yields no operations: that is what makes the webhook safe
under `reinvocationPolicy: IfNeeded`. No I/O here; `server.py` does that.

The object is untrusted input: every field read is type-checked, and one of
the wrong type raises PatchError naming its JSON Pointer, so the review allows
the object unchanged with that warning instead of failing with a TypeError.

The work is linear in the object and bounded: the server computes the patch on
its event loop, so a review that took seconds would stall every other review
and `/healthz` with it. Env mode therefore never rescans the operations it has
made (a set records the containers already given variables), and it declines
pods with more than MAX_CONTAINERS containers (TooManyContainers).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from nezha import trust_bundle
from nezha.errors import ConfigError, NezhaError
from webhook import sidecar as sc

INJECTED = "nezha.io/injected"
OPT_OUT = "nezha.io/inject"
MODES = ("hosts", "env")
# Each pair is one setting to clients: curl and wget read the lower case,
# others the upper case, and which one wins differs by client. So a container
# that sets either case owns the pair.
PROXY_VARS = ("HTTP_PROXY", "http_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
# Cluster-internal traffic stays direct when a rule injects a proxy: Service
# names by suffix, and addresses by the private ranges (clients that match
# CIDRs: Go, curl >= 7.86, requests; wget and urllib match suffixes only).
# Short names (`redis`, `redis.ml`) cannot be covered; see docs/webhook.md.
DEFAULT_NO_PROXY = ("localhost,127.0.0.1,::1,.svc,.svc.cluster.local,.cluster.local,kubernetes.default,"
                    "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16")

# Env mode declines a pod with more containers and init containers than this,
# failing open (allowed, unpatched, with a warning naming the count). Real pods
# have a handful; the bound is far above them and still keeps both the patch and
# the pod it makes small: each container gains four variables, about 0.4 KiB
# with the default NO_PROXY, and the patched pod must fit etcd's request limit
# (1.5 MiB by default), or the API server refuses it and the job is blocked by
# the webhook after all. 1,000 containers add about 0.4 MiB and take a few ms.
MAX_CONTAINERS = 1000

# S3's service names (not a bucket's virtual-hosted name), and the variables
# that choose an AWS SDK's S3 endpoint (the service-specific one first).
_S3_ENDPOINT = re.compile(r"^s3([.-][a-z0-9-]+)*\.amazonaws\.com(\.cn)?$")
S3_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")

# Where the pod spec and pod metadata sit in each kind we patch.
POD_PATHS: dict[str, tuple[str, str]] = {
    "Pod": ("/spec", "/metadata"),
    "Job": ("/spec/template/spec", "/spec/template/metadata"),
    "Deployment": ("/spec/template/spec", "/spec/template/metadata"),
    "StatefulSet": ("/spec/template/spec", "/spec/template/metadata"),
    "DaemonSet": ("/spec/template/spec", "/spec/template/metadata"),
    "ReplicaSet": ("/spec/template/spec", "/spec/template/metadata"),
    "CronJob": ("/spec/jobTemplate/spec/template/spec", "/spec/jobTemplate/spec/template/metadata"),
}


class RuleError(ConfigError):
    """A rule that cannot be used; the message names the rule and the field."""


class PatchError(NezhaError):
    """The object cannot be patched (its shape is not a pod spec we understand)."""


class TooManyContainers(PatchError):
    """Env mode declines a pod with more than MAX_CONTAINERS containers; the review allows it unpatched."""


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


@dataclass
class Patch:
    """What `patch_for` decided: the operations, the rules applied, and warnings."""

    ops: list[dict[str, Any]] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Why a sidecar asked for (rule or annotation) was not given: the pod is
    # centralized, and this is in its nezha.io/status annotation and the log.
    fallback: str | None = None
    # What went into nezha.io/status: "sidecar", "centralized: <why>", or None (nothing asked for a sidecar).
    status: str | None = None
    # What _warn has said, so that a warning per container stays linear.
    _warned: set[str] = field(default_factory=set, repr=False, compare=False)


def escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901 section 4): ~ before /."""
    return token.replace("~", "~0").replace("/", "~1")


# -- rules -----------------------------------------------------------------


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


# -- patch -----------------------------------------------------------------


def _at(obj: Any, pointer: str) -> Any:
    """The value at a JSON Pointer made of plain tokens, or None when absent."""
    for token in pointer.strip("/").split("/"):
        if not token:
            continue
        if not isinstance(obj, dict):
            return None
        obj = obj.get(token)
    return obj


def _what(value: Any) -> str:
    """What a value of the wrong type is, in JSON terms; never its (possibly huge or deep) repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return f"the string {_short(value)}"
    return "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__


def _short(text: str, limit: int = 63) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _warn(out: "Patch", message: str) -> None:
    """Add a warning once, however many containers or rules raise it."""
    if message not in out._warned:
        out._warned.add(message)
        out.warnings.append(message)


def patch_for(*, obj: dict[str, Any], kind: str, namespace: str | None, rules: tuple[Rule, ...] | list[Rule],
              cache_ip: str | None, proxy_url: str | None = None,
              no_proxy: str = DEFAULT_NO_PROXY, ca_configmap: str = trust_bundle.CONFIGMAP,
              sidecar: sc.SidecarConfig | None = None) -> Patch:
    """JSON-patch operations that make `obj` (a `kind`) use the cache.

    Matches rules on the pod's labels (a workload's template labels, or the
    workload's own), honours the opt-out annotation on either, and adds only
    what is missing. A rule is named in `rules` and in the annotation only
    when it added something. Raises PatchError when the object is not shaped
    like one, naming the field, and TooManyContainers when an env rule
    applies to more than MAX_CONTAINERS containers.

    Rules whose deployment (or the pod's `nezha.io/deployment`) is sidecar
    alias their hosts to 127.0.0.1 and share one native sidecar, built by
    webhook/sidecar.py from `sidecar` (the webhook's settings); without a
    usable one the pod is centralized and `fallback` says why.
    """
    if kind not in POD_PATHS:
        raise PatchError(f"kind {kind!r} is not one the webhook patches ({', '.join(POD_PATHS)})")
    if not isinstance(obj, dict):
        raise PatchError(f"{kind} object is {_what(obj)}, not a mapping")
    spec_path, meta_path = POD_PATHS[kind]
    spec = _at(obj, spec_path)
    if not isinstance(spec, dict):
        raise PatchError(f"{kind} has no pod spec at {spec_path}")
    pod_meta = _at(obj, meta_path)
    if pod_meta is not None and not isinstance(pod_meta, dict):
        raise PatchError(f"{kind} {meta_path} is {_what(pod_meta)}, not a mapping")
    own_meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    labels = {**_strdict(own_meta.get("labels")), **_strdict((pod_meta or {}).get("labels"))}
    annotations = {**_strdict(own_meta.get("annotations")), **_strdict((pod_meta or {}).get("annotations"))}

    out = Patch()
    opt = annotations.get(OPT_OUT)
    if opt is not None and opt.lower() == "false":
        return out
    matched = [r for r in rules if r.matches(labels=labels, namespace=namespace)]
    if not matched:
        return out
    if opt is not None and opt.lower() != "true":
        # Failing open: a typo in the opt-out must not stop the pod, but the user should hear of it.
        out.warnings.append(f"annotation {OPT_OUT} is {_short(opt)}; expected \"true\" or \"false\"; "
                            "treated as \"true\"")

    choice = sc.choose(rules=matched, annotations=annotations, spec=spec, config=sidecar)
    out.warnings += choice.warnings
    aliases = _existing_aliases(spec, spec_path)
    if (any(r.mode == "env" and (proxy_url is not None or choice.by_rule[r.name] == sc.SIDECAR) for r in matched)
            or any(r.tls for r in matched)):
        _check_container_count(spec, spec_path)
    sidecar_hosts: list[str] = []  # the hosts of rules served by the sidecar, in rule order
    env_done: set[str] = set()  # the env paths already given variables, shared by every env rule
    env_made: set[str] = set()  # the lists (env, volumes) this patch creates: later additions append to them
    trusting = False  # the CA bundle is given once, whichever tls rules ask for it
    applied: list[str] = []
    for rule in matched:
        before = len(out.ops)
        wanted = []
        in_pod = choice.by_rule[rule.name] == sc.SIDECAR
        for alias in rule.host_aliases:
            if in_pod:  # the sidecar, whatever the rule's ip says: that is the cluster tier's address
                wanted.append((sc.LOOPBACK, alias.hostnames))
                sidecar_hosts += [h for h in alias.hostnames if h not in sidecar_hosts]
                continue
            ip = alias.ip or cache_ip
            if ip is None:
                out.warnings.append(f"rule {rule.name!r}: no ip and the cache Service IP is not known yet; "
                                    f"{', '.join(alias.hostnames)} left alone")
                continue
            wanted.append((ip, alias.hostnames))
        aliases = _merge_aliases(out, spec_path, aliases, wanted)
        if rule.mode == "env":
            proxy = sc.PROXY_URL if in_pod else proxy_url
            if proxy is None:
                out.warnings.append(f"rule {rule.name!r}: mode env but no proxy URL is configured")
            else:
                _add_env(out, spec_path, spec, proxy, rule.no_proxy or no_proxy, env_done, env_made)
        if rule.tls and not trusting:
            trusting = True
            _add_trust(out, spec_path, spec, ca_configmap, env_made, s3_endpoint=_s3_endpoint(matched))
        # Only a rule that changed something is recorded: one whose hostnames
        # the pod already maps (a reinvocation, or the pod's own entries)
        # injected nothing.
        if len(out.ops) > before:
            applied.append(rule.name)
    if sidecar_hosts:
        assert sidecar is not None  # choose() gives sidecar only with a config
        # Last: the sidecar goes first among the init containers, which would
        # shift the indices the env and trust ops above name.
        size, warnings = sc.size_of(annotations, sidecar)
        out.warnings += warnings
        _add_sidecar(out, spec_path, spec, sidecar, sidecar_hosts, size, env_made)
        out.status = sc.SIDECAR
    elif choice.fallback is not None:
        out.fallback = choice.fallback
        out.status = f"{sc.CENTRALIZED}: {choice.fallback}"
        out.warnings.append(f"deployment sidecar was asked for; the pod uses the cluster cache instead: "
                            f"{choice.fallback}")
    if applied:
        out.rules = applied
    wanted_annotations = {}
    if applied:
        wanted_annotations[INJECTED] = applied
    if out.status is not None:
        wanted_annotations[sc.STATUS_ANNOTATION] = out.status
    if sidecar_hosts:
        wanted_annotations[sc.HOSTS_ANNOTATION] = sc.HOSTS_FILE
    if wanted_annotations:
        _annotate(out, meta_path, pod_meta, wanted_annotations)
    return out


def _strdict(v: Any) -> dict[str, str]:
    return {k: x for k, x in v.items() if isinstance(k, str) and isinstance(x, str)} if isinstance(v, dict) else {}


def _existing_aliases(spec: dict, spec_path: str) -> list[dict[str, Any]] | None:
    """The pod's hostAliases, checked to be entries of an IP string and a list of hostname strings."""
    aliases = spec.get("hostAliases")
    if aliases is None:
        return None
    where = f"{spec_path}/hostAliases"
    if not isinstance(aliases, list):
        raise PatchError(f"{where} is not a list of entries: it is {_what(aliases)}")
    for i, a in enumerate(aliases):
        if not isinstance(a, dict):
            raise PatchError(f"{where}/{i} is {_what(a)}, not a hostAliases entry")
        ip = a.get("ip")
        if ip is not None and not isinstance(ip, str):
            raise PatchError(f"{where}/{i}/ip is {_what(ip)}, not an IP address")
        names = a.get("hostnames")
        if names is None:
            continue
        if not isinstance(names, list):
            raise PatchError(f"{where}/{i}/hostnames is {_what(names)}, not a list of hostnames")
        for j, h in enumerate(names):
            if not isinstance(h, str):
                raise PatchError(f"{where}/{i}/hostnames/{j} is {_what(h)}, not a hostname")
    return aliases


def _merge_aliases(out: Patch, spec_path: str, aliases: list | None,
                   wanted: list[tuple[str, tuple[str, ...]]]) -> list | None:
    """Append ops for `wanted` to `out`; returns the aliases as they will be after them."""
    if not wanted:
        return aliases
    state = [dict(a, hostnames=list(a.get("hostnames") or [])) for a in aliases] if aliases is not None else []
    had_hostnames = [isinstance(a.get("hostnames"), list) for a in (aliases or [])]
    mapped = {h: a.get("ip") for a in state for h in a["hostnames"]}
    new_entries: list[dict[str, Any]] = []
    for ip, hostnames in wanted:
        missing = []
        for h in hostnames:
            if h in mapped:
                if mapped[h] != ip:
                    _warn(out, f"hostname {h} already maps to {str(mapped[h])[:45]} in the pod; left alone")
                continue
            missing.append(h)
            mapped[h] = ip
        if not missing:
            continue
        index = next((i for i, a in enumerate(state) if a.get("ip") == ip), None)
        if index is None:
            entry = {"ip": ip, "hostnames": missing}
            state.append(entry)
            new_entries.append(entry)
        elif aliases is not None and index < len(aliases):
            base = f"{spec_path}/hostAliases/{index}/hostnames"
            if had_hostnames[index]:
                out.ops.extend({"op": "add", "path": f"{base}/-", "value": h} for h in missing)
            else:
                out.ops.append({"op": "add", "path": base, "value": list(missing)})
                had_hostnames[index] = True
            state[index]["hostnames"].extend(missing)
        else:  # an entry this patch adds: extend it before it is emitted
            state[index]["hostnames"].extend(missing)
    if aliases is None:
        if state:
            out.ops.append({"op": "add", "path": f"{spec_path}/hostAliases", "value": state})
    else:
        out.ops.extend({"op": "add", "path": f"{spec_path}/hostAliases/-", "value": e} for e in new_entries)
    return state if state or aliases is not None else None


def _check_container_count(spec: dict, spec_path: str) -> None:
    """Raise TooManyContainers past MAX_CONTAINERS; checked before any op is built, so the bound bounds the work.

    Groups that are not lists are not counted here: _add_env names them, in the order it always has.
    """
    count = sum(len(g) for g in (spec.get("initContainers"), spec.get("containers")) if isinstance(g, list))
    if count > MAX_CONTAINERS:
        raise TooManyContainers(f"{spec_path} has {count} containers and init containers, more than the "
                                f"{MAX_CONTAINERS} that mode env patches")


def _add_env(out: Patch, spec_path: str, spec: dict, proxy_url: str, no_proxy: str, done: set[str],
             made: set[str]) -> None:
    """Give each container the proxy pairs it does not set itself.

    A container that sets HTTP_PROXY or http_proxy has a proxy of its own:
    it gets nothing, not even NO_PROXY, which would change how its own proxy
    is used. One that sets only NO_PROXY or no_proxy keeps its value and gets
    the proxy pair, with a warning. One with envFrom may set any of them
    where the webhook cannot see, so it is left alone, with a warning.

    `done` holds the env paths an earlier env rule of this patch gave
    variables; this call adds its own. Looking a container up there, rather
    than scanning the ops so far, is what keeps env mode linear.
    """
    for where, c in _containers(spec, spec_path):
        own = set(_env_of(c, where))
        env_from = c.get("envFrom")
        if env_from is not None and not isinstance(env_from, list):
            raise PatchError(f"{where}/envFrom is {_what(env_from)}, not a list")
        base = f"{where}/env"
        if base in done:
            continue  # an earlier env rule already decided for this container
        name = c.get("name")
        label = f"container {_short(name)}" if isinstance(name, str) else where
        if env_from:
            _warn(out, f"{label} has envFrom, which may set proxy variables the webhook cannot see; "
                  "its proxy variables are left alone")
            continue
        if mine := sorted(own & set(PROXY_VARS)):
            _warn(out, f"{label} sets {mine[0]} itself; its proxy variables are left alone")
            continue
        add = [{"name": v, "value": proxy_url} for v in PROXY_VARS]
        if mine := sorted(own & set(NO_PROXY_VARS)):
            _warn(out, f"{label} sets {mine[0]} itself, which is kept: hosts it does not list, cluster "
                  "Services included, go to the cache proxy, which refuses hosts it does not cache")
        else:
            add += [{"name": v, "value": no_proxy} for v in NO_PROXY_VARS]
        _append(out, base, c.get("env") is not None or base in made, add)
        made.add(base)
        done.add(base)


def _append(out: Patch, base: str, exists: bool, items: list[dict[str, Any]]) -> None:
    """Ops adding `items` to the list at `base`: one op making it, or one per item appended."""
    if not items:
        return
    if exists:
        out.ops.extend({"op": "add", "path": f"{base}/-", "value": e} for e in items)
    else:
        out.ops.append({"op": "add", "path": base, "value": items})


def _containers(spec: dict, spec_path: str):
    """(path, container) of every init container and container, each checked to be a mapping.

    Not the Nezha sidecar (a pod made from a template patched already has
    it): it is the cache itself and takes neither proxy variables nor the CA.
    """
    for group in ("initContainers", "containers"):
        containers = spec.get(group)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise PatchError(f"{spec_path}/{group} is {_what(containers)}, not a list")
        for i, c in enumerate(containers):
            where = f"{spec_path}/{group}/{i}"
            if not isinstance(c, dict):
                raise PatchError(f"{where} is {_what(c)}, not a container")
            if group == "initContainers" and c.get("name") == sc.CONTAINER and c.get("restartPolicy") == "Always":
                continue
            yield where, c


def _list_at(container: dict, where: str, field_name: str, what: str) -> list:
    value = container.get(field_name)
    if value is not None and not isinstance(value, list):
        raise PatchError(f"{where}/{field_name} is {_what(value)}, not a list")
    for j, item in enumerate(value or []):
        if not isinstance(item, dict):
            raise PatchError(f"{where}/{field_name}/{j} is {_what(item)}, not {what}")
    return value if value is not None else []


def _s3_endpoint(rules: list[Rule]) -> str | None:
    """The S3 service name (s3.amazonaws.com, s3.REGION.amazonaws.com) a tls rule aliases, if any."""
    return next((h for r in rules if r.tls for a in r.host_aliases for h in a.hostnames if _S3_ENDPOINT.match(h)),
                None)


def _env_of(container: dict, where: str) -> dict[str, Any]:
    """The container's own variables, name -> value (None when from valueFrom), each checked to be named."""
    env = _list_at(container, where, "env", "a variable")
    for j, e in enumerate(env):
        if not isinstance(e.get("name"), str):
            raise PatchError(f"{where}/env/{j}/name is {_what(e.get('name'))}, not a variable name")
    return {e["name"]: e.get("value") for e in env}


def _add_trust(out: Patch, spec_path: str, spec: dict, configmap: str, made: set[str], *,
               s3_endpoint: str | None = None) -> None:
    """Make every container trust the Nezha CA (nezha/trust_bundle.py): the
    `nezha-ca` ConfigMap as a volume, mounted read-only at CA_DIR, and each
    client's variable naming its file.

    A variable the container sets itself is the user's and is kept, with a
    warning naming it (that client may then refuse the cache's certificates).
    A container with envFrom still gets the variables, since without them
    its HTTPS downloads of aliased hosts would fail; a value of the same name
    in its envFrom source is overridden, and the warning says so. Everything
    already present (a reinvocation) is left as it is, so a second pass adds nothing.

    With `s3_endpoint` (a tls rule aliases S3's service name), AWS SDKs are
    pointed at it too: AWS_ENDPOINT_URL_S3=https://<it>. A custom endpoint
    makes boto3 address buckets path-style (`s3.amazonaws.com/BUCKET/KEY`),
    so every bucket reaches the cache through the one aliased name, where
    virtual-hosted names (`BUCKET.s3.amazonaws.com`) would each need an
    alias. Not for a container that sets AWS_ENDPOINT_URL or
    AWS_ENDPOINT_URL_S3 itself, nor one with envFrom, which may: an endpoint
    changes where requests go, not only whom they trust.
    """
    volumes = spec.get("volumes")
    if volumes is not None and not isinstance(volumes, list):
        raise PatchError(f"{spec_path}/volumes is {_what(volumes)}, not a list")
    names = {v.get("name") for v in volumes or [] if isinstance(v, dict)}
    if trust_bundle.VOLUME not in names:
        volume = {"name": trust_bundle.VOLUME, "configMap": {"name": configmap}}
        _append(out, f"{spec_path}/volumes", volumes is not None, [volume])
        made.add(f"{spec_path}/volumes")  # the sidecar's volume, added later, appends to it
    ours = dict(trust_bundle.VARIABLES)
    for where, c in _containers(spec, spec_path):
        name = c.get("name")
        label = f"container {_short(name)}" if isinstance(name, str) else where
        mounts = _list_at(c, where, "volumeMounts", "a volume mount")
        if not any(m.get("name") == trust_bundle.VOLUME or m.get("mountPath") == trust_bundle.CA_DIR
                   for m in mounts):
            mount = {"name": trust_bundle.VOLUME, "mountPath": trust_bundle.CA_DIR, "readOnly": True}
            _append(out, f"{where}/volumeMounts", c.get("volumeMounts") is not None, [mount])
        own = _env_of(c, where)
        for var in sorted(set(own) & set(ours)):
            if own[var] != ours[var]:
                _warn(out, f"{label} sets {var} itself, which is kept: a client reading it may refuse the "
                      f"cache's certificates for HTTPS downloads of aliased hosts")
        base = f"{where}/env"
        add = [{"name": var, "value": file} for var, file in trust_bundle.VARIABLES if var not in own]
        if s3_endpoint is not None and not c.get("envFrom") and not own.keys() & set(S3_ENDPOINT_VARS):
            add.append({"name": S3_ENDPOINT_VARS[0], "value": f"https://{s3_endpoint}"})
        if add and c.get("envFrom"):
            _warn(out, f"{label} has envFrom; the CA variables ({', '.join(v for v, _ in trust_bundle.VARIABLES)}) "
                  "are set in env, which takes precedence over the same names there")
        _append(out, base, c.get("env") is not None or base in made, add)
        if add:
            made.add(base)


def _annotate(out: Patch, meta_path: str, meta: dict | None, wanted: dict[str, Any]) -> None:
    """Set the pod's annotations: INJECTED gets the rules that injected (a list), kept with the names already
    recorded (an earlier pass or workload template); any other key its string. All in one op when the pod has
    no annotations yet, so two keys never race to create the mapping."""
    annotations = meta.get("annotations") if meta is not None else None
    if annotations is not None and not isinstance(annotations, dict):
        raise PatchError(f"{meta_path}/annotations is {_what(annotations)}, not a mapping")
    values: dict[str, str] = {}
    for key, value in wanted.items():
        if key == INJECTED:
            current = (annotations or {}).get(INJECTED)
            names = [n for n in current.split(",") if n] if isinstance(current, str) else []
            value = ",".join(names + [n for n in value if n not in names])
        if (annotations or {}).get(key) != value:
            values[key] = value
    if not values:
        return
    if meta is None:
        out.ops.append({"op": "add", "path": meta_path, "value": {"annotations": values}})
    elif annotations is None:
        out.ops.append({"op": "add", "path": f"{meta_path}/annotations", "value": values})
    else:
        # "add" on an existing member replaces it (RFC 6902 section 4.1).
        out.ops.extend({"op": "add", "path": f"{meta_path}/annotations/{escape(k)}", "value": v}
                       for k, v in values.items())


def _add_sidecar(out: Patch, spec_path: str, spec: dict, config: sc.SidecarConfig, hosts: list[str],
                 size: str, made: set[str]) -> None:
    """The native sidecar, its volumes (data, and its own /etc/hosts) and the pod sysctl that lets it bind 80
    and 443, each only when
    missing (a reinvocation, or a pod made from a template the webhook patched already, adds nothing).

    The sidecar goes first among the init containers, so the pod's own init containers download through it
    too: Kubernetes starts the next init container once a restartable one's startup probe passes.
    """
    inits = spec.get("initContainers")
    if inits is not None and not isinstance(inits, list):
        raise PatchError(f"{spec_path}/initContainers is {_what(inits)}, not a list")
    if not any(isinstance(c, dict) and c.get("name") == sc.CONTAINER for c in inits or []):
        container = sc.container(config=config, hosts=hosts, size=size)
        if inits is None:
            out.ops.append({"op": "add", "path": f"{spec_path}/initContainers", "value": [container]})
        else:
            out.ops.append({"op": "add", "path": f"{spec_path}/initContainers/0", "value": container})
    volumes = spec.get("volumes")
    if volumes is not None and not isinstance(volumes, list):
        raise PatchError(f"{spec_path}/volumes is {_what(volumes)}, not a list")
    present = {v.get("name") for v in volumes or [] if isinstance(v, dict)}
    base = f"{spec_path}/volumes"
    _append(out, base, volumes is not None or base in made, [v for v in sc.volumes(size) if v["name"] not in present])
    security = spec.get("securityContext")
    sysctl = {"name": sc.SYSCTL, "value": "0"}
    if security is None:
        out.ops.append({"op": "add", "path": f"{spec_path}/securityContext", "value": {"sysctls": [sysctl]}})
        return
    if not isinstance(security, dict):
        raise PatchError(f"{spec_path}/securityContext is {_what(security)}, not a mapping")
    sysctls = security.get("sysctls")
    if sysctls is not None and not isinstance(sysctls, list):
        raise PatchError(f"{spec_path}/securityContext/sysctls is {_what(sysctls)}, not a list")
    if not any(isinstance(s, dict) and s.get("name") == sc.SYSCTL for s in sysctls or []):
        _append(out, f"{spec_path}/securityContext/sysctls", sysctls is not None, [sysctl])
