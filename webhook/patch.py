"""Pure core of the webhook: rules and pod -> JSON-patch operations.

The patch is computed against the object as it is, so running it again on
the patched object yields no operations: that is what makes the webhook safe
under `reinvocationPolicy: IfNeeded`. No I/O here; `server.py` does that.

The rules are `webhook/rules.py`'s; the object's fields are read checked
(`webhook/ops.py`: the object is untrusted input); what a rule adds to
containers (proxy variables, the CA bundle, the sidecar) is
`webhook/containers.py`'s. This module matches rules to the pod and adds
its hostAliases and annotations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nezha import trust_bundle
from webhook import sidecar as sc
from webhook.containers import add_env, add_sidecar, add_trust, check_container_count, s3_endpoint
from webhook.ops import Patch, PatchError, at, escape, kind_of, short, strdict, warn
from webhook.rules import Rule

INJECTED = "nezha.io/injected"
OPT_OUT = "nezha.io/inject"
# Cluster-internal traffic stays direct when a rule injects a proxy: Service
# names by suffix, and addresses by the private ranges (clients that match
# CIDRs: Go, curl >= 7.86, requests; wget and urllib match suffixes only).
# Short names (`redis`, `redis.ml`) cannot be covered; see docs/webhook.md.
DEFAULT_NO_PROXY = ("localhost,127.0.0.1,::1,.svc,.svc.cluster.local,.cluster.local,kubernetes.default,"
                    "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16")

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


@dataclass(frozen=True)
class _Pod:
    """Where the pod spec and metadata of an object sit, and the labels and annotations rules match on."""

    spec_path: str
    meta_path: str
    spec: dict
    meta: dict | None
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class _Applying:
    """What the matched rules of one patch share as they are applied in order."""

    aliases: list | None  # the pod's hostAliases as they will be after the ops so far
    sidecar_hosts: list[str] = field(default_factory=list)  # the hosts of rules served by the sidecar, in rule order
    env_done: set[str] = field(default_factory=set)  # the env paths already given variables, shared by every env rule
    env_made: set[str] = field(default_factory=set)  # the lists (env, volumes) this patch creates: later additions append to them
    trusting: bool = False  # the CA bundle is given once, whichever tls rules ask for it


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
    pod = _pod(obj, kind)
    out = Patch()
    opt = pod.annotations.get(OPT_OUT)
    if opt is not None and opt.lower() == "false":
        return out
    matched = [r for r in rules if r.matches(labels=pod.labels, namespace=namespace)]
    if not matched:
        return out
    if opt is not None and opt.lower() != "true":
        # Failing open: a typo in the opt-out must not stop the pod, but the user should hear of it.
        out.warnings.append(f"annotation {OPT_OUT} is {short(opt)}; expected \"true\" or \"false\"; "
                            "treated as \"true\"")

    choice = sc.choose(rules=matched, annotations=pod.annotations, spec=pod.spec, config=sidecar)
    out.warnings += choice.warnings
    state = _Applying(aliases=_existing_aliases(pod.spec, pod.spec_path))
    if (any(r.mode == "env" and (proxy_url is not None or choice.by_rule[r.name] == sc.SIDECAR) for r in matched)
            or any(r.tls for r in matched)):
        check_container_count(pod.spec, pod.spec_path)
    applied: list[str] = []
    for rule in matched:
        before = len(out.ops)
        _apply(out, rule, state, pod=pod, in_pod=choice.by_rule[rule.name] == sc.SIDECAR, cache_ip=cache_ip,
               proxy_url=proxy_url, no_proxy=no_proxy, ca_configmap=ca_configmap, matched=matched)
        # Only a rule that changed something is recorded: one whose hostnames
        # the pod already maps (a reinvocation, or the pod's own entries)
        # injected nothing.
        if len(out.ops) > before:
            applied.append(rule.name)
    _place_cache(out, state, pod=pod, choice=choice, sidecar=sidecar)
    _record(out, applied, state, pod=pod)
    return out


def _pod(obj: dict[str, Any], kind: str) -> _Pod:
    """The pod of `obj`, each part checked to be the shape a pod spec has; PatchError naming the one that is not."""
    if kind not in POD_PATHS:
        raise PatchError(f"kind {kind!r} is not one the webhook patches ({', '.join(POD_PATHS)})")
    if not isinstance(obj, dict):
        raise PatchError(f"{kind} object is {kind_of(obj)}, not a mapping")
    spec_path, meta_path = POD_PATHS[kind]
    spec = at(obj, spec_path)
    if not isinstance(spec, dict):
        raise PatchError(f"{kind} has no pod spec at {spec_path}")
    pod_meta = at(obj, meta_path)
    if pod_meta is not None and not isinstance(pod_meta, dict):
        raise PatchError(f"{kind} {meta_path} is {kind_of(pod_meta)}, not a mapping")
    own_meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    labels = {**strdict(own_meta.get("labels")), **strdict((pod_meta or {}).get("labels"))}
    annotations = {**strdict(own_meta.get("annotations")), **strdict((pod_meta or {}).get("annotations"))}
    return _Pod(spec_path=spec_path, meta_path=meta_path, spec=spec, meta=pod_meta, labels=labels,
                annotations=annotations)


def _apply(out: Patch, rule: Rule, state: _Applying, *, pod: _Pod, in_pod: bool, cache_ip: str | None,
           proxy_url: str | None, no_proxy: str, ca_configmap: str, matched: list[Rule]) -> None:
    """Add what `rule` asks for and the pod lacks: its hostAliases, its proxy
    variables (mode env), the CA bundle (tls, once per patch). `in_pod`: the
    rule is served by the sidecar."""
    wanted = []
    for alias in rule.host_aliases:
        if in_pod:  # the sidecar, whatever the rule's ip says: that is the cluster tier's address
            wanted.append((sc.LOOPBACK, alias.hostnames))
            state.sidecar_hosts += [h for h in alias.hostnames if h not in state.sidecar_hosts]
            continue
        ip = alias.ip or cache_ip
        if ip is None:
            out.warnings.append(f"rule {rule.name!r}: no ip and the cache Service IP is not known yet; "
                                f"{', '.join(alias.hostnames)} left alone")
            continue
        wanted.append((ip, alias.hostnames))
    state.aliases = _merge_aliases(out, pod.spec_path, state.aliases, wanted)
    if rule.mode == "env":
        proxy = sc.PROXY_URL if in_pod else proxy_url
        if proxy is None:
            out.warnings.append(f"rule {rule.name!r}: mode env but no proxy URL is configured")
        else:
            add_env(out, pod.spec_path, pod.spec, proxy, rule.no_proxy or no_proxy, state.env_done, state.env_made)
    if rule.tls and not state.trusting:
        state.trusting = True
        add_trust(out, pod.spec_path, pod.spec, ca_configmap, state.env_made, s3_endpoint=s3_endpoint(matched))


def _record(out: Patch, applied: list[str], state: _Applying, *, pod: _Pod) -> None:
    """Name in `out` and in the pod's annotations the rules that injected,
    where the pod's cache runs, and the sidecar's hosts file."""
    if applied:
        out.rules = applied
    wanted_annotations: dict[str, Any] = {}
    if applied:
        wanted_annotations[INJECTED] = applied
    if out.status is not None:
        wanted_annotations[sc.STATUS_ANNOTATION] = out.status
    if state.sidecar_hosts:
        wanted_annotations[sc.HOSTS_ANNOTATION] = sc.HOSTS_FILE
    if wanted_annotations:
        _annotate(out, pod.meta_path, pod.meta, wanted_annotations)


def _place_cache(out: Patch, state: _Applying, *, pod: _Pod, choice: sc.Choice,
                 sidecar: sc.SidecarConfig | None) -> None:
    """The sidecar, when a rule is served by one; else, when one was asked for
    and cannot be given, why the pod uses the cluster cache instead."""
    if state.sidecar_hosts:
        assert sidecar is not None  # choose() gives sidecar only with a config
        # Last: the sidecar goes first among the init containers, which would
        # shift the indices the env and trust ops above name.
        size, warnings = sc.size_of(pod.annotations, sidecar)
        out.warnings += warnings
        add_sidecar(out, pod.spec_path, pod.spec, sidecar, state.sidecar_hosts, size, state.env_made)
        out.status = sc.SIDECAR
    elif choice.fallback is not None:
        out.fallback = choice.fallback
        out.status = f"{sc.CENTRALIZED}: {choice.fallback}"
        out.warnings.append(f"deployment sidecar was asked for; the pod uses the cluster cache instead: "
                            f"{choice.fallback}")


def _existing_aliases(spec: dict, spec_path: str) -> list[dict[str, Any]] | None:
    """The pod's hostAliases, checked to be entries of an IP string and a list of hostname strings."""
    aliases = spec.get("hostAliases")
    if aliases is None:
        return None
    where = f"{spec_path}/hostAliases"
    if not isinstance(aliases, list):
        raise PatchError(f"{where} is not a list of entries: it is {kind_of(aliases)}")
    for i, a in enumerate(aliases):
        if not isinstance(a, dict):
            raise PatchError(f"{where}/{i} is {kind_of(a)}, not a hostAliases entry")
        ip = a.get("ip")
        if ip is not None and not isinstance(ip, str):
            raise PatchError(f"{where}/{i}/ip is {kind_of(ip)}, not an IP address")
        names = a.get("hostnames")
        if names is None:
            continue
        if not isinstance(names, list):
            raise PatchError(f"{where}/{i}/hostnames is {kind_of(names)}, not a list of hostnames")
        for j, h in enumerate(names):
            if not isinstance(h, str):
                raise PatchError(f"{where}/{i}/hostnames/{j} is {kind_of(h)}, not a hostname")
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
                    warn(out, f"hostname {h} already maps to {str(mapped[h])[:45]} in the pod; left alone")
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


def _annotate(out: Patch, meta_path: str, meta: dict | None, wanted: dict[str, Any]) -> None:
    """Set the pod's annotations: INJECTED gets the rules that injected (a list), kept with the names already
    recorded (an earlier pass or workload template); any other key its string. All in one op when the pod has
    no annotations yet, so two keys never race to create the mapping."""
    annotations = meta.get("annotations") if meta is not None else None
    if annotations is not None and not isinstance(annotations, dict):
        raise PatchError(f"{meta_path}/annotations is {kind_of(annotations)}, not a mapping")
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
