"""Pure: what a matched rule adds to a pod's containers and spec beyond its
hostAliases: the proxy variables (mode env), the Nezha CA bundle (tls),
and the native sidecar (deployment sidecar).

The work is linear in the object and bounded: the server computes the patch on
its event loop, so a review that took seconds would stall every other review
and `/healthz` with it. Env mode therefore never rescans the operations it has
made (a set records the containers already given variables), and it declines
pods with more than MAX_CONTAINERS containers (TooManyContainers).
"""

from __future__ import annotations

import re

from nezha import trust_bundle
from webhook import sidecar as sc
from webhook.ops import (Patch, PatchError, TooManyContainers, append, containers, env_of, kind_of, list_at, short,
                         warn)
from webhook.rules import Rule

# Each pair is one setting to clients: curl and wget read the lower case,
# others the upper case, and which one wins differs by client. So a container
# that sets either case owns the pair.
PROXY_VARS = ("HTTP_PROXY", "http_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")

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


def check_container_count(spec: dict, spec_path: str) -> None:
    """Raise TooManyContainers past MAX_CONTAINERS; checked before any op is built, so the bound bounds the work.

    Groups that are not lists are not counted here: _add_env names them, in the order it always has.
    """
    count = sum(len(g) for g in (spec.get("initContainers"), spec.get("containers")) if isinstance(g, list))
    if count > MAX_CONTAINERS:
        raise TooManyContainers(f"{spec_path} has {count} containers and init containers, more than the "
                                f"{MAX_CONTAINERS} that mode env patches")


def add_env(out: Patch, spec_path: str, spec: dict, proxy_url: str, no_proxy: str, done: set[str],
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
    for where, c in containers(spec, spec_path):
        own = set(env_of(c, where))
        env_from = c.get("envFrom")
        if env_from is not None and not isinstance(env_from, list):
            raise PatchError(f"{where}/envFrom is {kind_of(env_from)}, not a list")
        base = f"{where}/env"
        if base in done:
            continue  # an earlier env rule already decided for this container
        name = c.get("name")
        label = f"container {short(name)}" if isinstance(name, str) else where
        if env_from:
            warn(out, f"{label} has envFrom, which may set proxy variables the webhook cannot see; "
                  "its proxy variables are left alone")
            continue
        if mine := sorted(own & set(PROXY_VARS)):
            warn(out, f"{label} sets {mine[0]} itself; its proxy variables are left alone")
            continue
        add = [{"name": v, "value": proxy_url} for v in PROXY_VARS]
        if mine := sorted(own & set(NO_PROXY_VARS)):
            warn(out, f"{label} sets {mine[0]} itself, which is kept: hosts it does not list, cluster "
                  "Services included, go to the cache proxy, which refuses hosts it does not cache")
        else:
            add += [{"name": v, "value": no_proxy} for v in NO_PROXY_VARS]
        append(out, base, c.get("env") is not None or base in made, add)
        made.add(base)
        done.add(base)


def s3_endpoint(rules: list[Rule]) -> str | None:
    """The S3 service name (s3.amazonaws.com, s3.REGION.amazonaws.com) a tls rule aliases, if any."""
    return next((h for r in rules if r.tls for a in r.host_aliases for h in a.hostnames if _S3_ENDPOINT.match(h)),
                None)


def add_trust(out: Patch, spec_path: str, spec: dict, configmap: str, made: set[str], *,
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
        raise PatchError(f"{spec_path}/volumes is {kind_of(volumes)}, not a list")
    names = {v.get("name") for v in volumes or [] if isinstance(v, dict)}
    if trust_bundle.VOLUME not in names:
        volume = {"name": trust_bundle.VOLUME, "configMap": {"name": configmap}}
        append(out, f"{spec_path}/volumes", volumes is not None, [volume])
        made.add(f"{spec_path}/volumes")  # the sidecar's volume, added later, appends to it
    ours = dict(trust_bundle.VARIABLES)
    for where, c in containers(spec, spec_path):
        name = c.get("name")
        label = f"container {short(name)}" if isinstance(name, str) else where
        mounts = list_at(c, where, "volumeMounts", "a volume mount")
        if not any(m.get("name") == trust_bundle.VOLUME or m.get("mountPath") == trust_bundle.CA_DIR
                   for m in mounts):
            mount = {"name": trust_bundle.VOLUME, "mountPath": trust_bundle.CA_DIR, "readOnly": True}
            append(out, f"{where}/volumeMounts", c.get("volumeMounts") is not None, [mount])
        own = env_of(c, where)
        for var in sorted(set(own) & set(ours)):
            if own[var] != ours[var]:
                warn(out, f"{label} sets {var} itself, which is kept: a client reading it may refuse the "
                      f"cache's certificates for HTTPS downloads of aliased hosts")
        base = f"{where}/env"
        add = [{"name": var, "value": file} for var, file in trust_bundle.VARIABLES if var not in own]
        if s3_endpoint is not None and not c.get("envFrom") and not own.keys() & set(S3_ENDPOINT_VARS):
            add.append({"name": S3_ENDPOINT_VARS[0], "value": f"https://{s3_endpoint}"})
        if add and c.get("envFrom"):
            warn(out, f"{label} has envFrom; the CA variables ({', '.join(v for v, _ in trust_bundle.VARIABLES)}) "
                  "are set in env, which takes precedence over the same names there")
        append(out, base, c.get("env") is not None or base in made, add)
        if add:
            made.add(base)


def add_sidecar(out: Patch, spec_path: str, spec: dict, config: sc.SidecarConfig, hosts: list[str],
                 size: str, made: set[str]) -> None:
    """The native sidecar, its volumes (data, and its own /etc/hosts) and the pod sysctl that lets it bind 80
    and 443, each only when
    missing (a reinvocation, or a pod made from a template the webhook patched already, adds nothing).

    The sidecar goes first among the init containers, so the pod's own init containers download through it
    too: Kubernetes starts the next init container once a restartable one's startup probe passes.
    """
    inits = spec.get("initContainers")
    if inits is not None and not isinstance(inits, list):
        raise PatchError(f"{spec_path}/initContainers is {kind_of(inits)}, not a list")
    if not any(isinstance(c, dict) and c.get("name") == sc.CONTAINER for c in inits or []):
        container = sc.container(config=config, hosts=hosts, size=size)
        if inits is None:
            out.ops.append({"op": "add", "path": f"{spec_path}/initContainers", "value": [container]})
        else:
            out.ops.append({"op": "add", "path": f"{spec_path}/initContainers/0", "value": container})
    volumes = spec.get("volumes")
    if volumes is not None and not isinstance(volumes, list):
        raise PatchError(f"{spec_path}/volumes is {kind_of(volumes)}, not a list")
    present = {v.get("name") for v in volumes or [] if isinstance(v, dict)}
    base = f"{spec_path}/volumes"
    append(out, base, volumes is not None or base in made, [v for v in sc.volumes(size) if v["name"] not in present])
    security = spec.get("securityContext")
    sysctl = {"name": sc.SYSCTL, "value": "0"}
    if security is None:
        out.ops.append({"op": "add", "path": f"{spec_path}/securityContext", "value": {"sysctls": [sysctl]}})
        return
    if not isinstance(security, dict):
        raise PatchError(f"{spec_path}/securityContext is {kind_of(security)}, not a mapping")
    sysctls = security.get("sysctls")
    if sysctls is not None and not isinstance(sysctls, list):
        raise PatchError(f"{spec_path}/securityContext/sysctls is {kind_of(sysctls)}, not a list")
    if not any(isinstance(s, dict) and s.get("name") == sc.SYSCTL for s in sysctls or []):
        append(out, f"{spec_path}/securityContext/sysctls", sysctls is not None, [sysctl])
