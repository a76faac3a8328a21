"""Pure: the sidecar deployment model, a cache tier inside the training pod (docs/deployment-models.md).

A pod whose rule (or annotation) chooses `deployment: sidecar` gets, beside
its own containers, a native sidecar: an init container with
`restartPolicy: Always` running `nezha cache` on the pod's loopback, whose
parent is the cluster Service. The rule's hosts are aliased to 127.0.0.1, so
the pod's unmodified downloads reach the sidecar; repeated reads (epochs) are
served from the pod's own disk, misses go to the cluster tier, and a sidecar
that cannot reach the cluster goes to the origin itself.

Everything here decides; nothing here does I/O. `webhook/patch.py` calls
`choose` to settle the model of a pod and `add_sidecar` to build the ops.

Least privilege. The sidecar is non-root with a read-only root file system
and every capability dropped. It binds ports 80 and 443, which a non-root
process may do only with CAP_NET_BIND_SERVICE in its *effective* set; adding
the capability to a container does not give it there: Kubernetes sets no
ambient capabilities, so a non-root process loses added capabilities at
exec, and `allowPrivilegeEscalation: false` (no_new_privs) rules out file
capabilities too. The pod therefore gets the safe, network-namespaced sysctl
`net.ipv4.ip_unprivileged_port_start=0` instead: it lets processes of this
pod, and only in this pod's own network namespace, bind low ports, and
grants nothing else. It is refused for hostNetwork pods (the namespace would
be the node's), so those stay centralized.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

CENTRALIZED = "centralized"
SIDECAR = "sidecar"
DEPLOYMENTS = (CENTRALIZED, SIDECAR)

DEPLOYMENT_ANNOTATION = "nezha.io/deployment"
SIZE_ANNOTATION = "nezha.io/sidecar-size"
STATUS_ANNOTATION = "nezha.io/status"

CONTAINER = "nezha-cache"
VOLUME = "nezha-cache-data"
# The sidecar's own /etc/hosts. hostAliases are the pod's, so without one of
# its own the sidecar would resolve the origins' names to itself too, and a
# sidecar that cannot reach the cluster could not reach the origins either.
# The kubelet leaves /etc/hosts alone in a container that mounts something
# there (kubelet_pods.go makeMounts), so the sidecar mounts this file, which
# a downwardAPI volume makes from a pod annotation: localhost only, the
# rest by DNS.
HOSTS_VOLUME = "nezha-cache-hosts"
HOSTS_ANNOTATION = "nezha.io/sidecar-hosts"
HOSTS_FILE = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
DATA_MOUNT = "/var/lib/nezha"
TMP_MOUNT = "/tmp"
LOOPBACK = "127.0.0.1"
HTTP_PORT = 80
TLS_PORT = 443
PROXY_URL = f"http://{LOOPBACK}:{HTTP_PORT}"
SYSCTL = "net.ipv4.ip_unprivileged_port_start"
UID = 10001  # the image's user (Dockerfile)

# Native sidecars (restartPolicy: Always on an init container) are on by
# default from Kubernetes 1.29; before, the field is dropped or refused.
NATIVE_SIDECARS_SINCE = (1, 29)

# The data volume's sizeLimit is enforced by the kubelet by evicting the
# whole pod (the training job with it), so the node's --capacity stays well
# below it: the cache evicts at capacity, but its usage may pass it for a
# while (fills of unknown length reserve nothing until they finish; an
# evicted object still being read keeps its blocks until the reader closes
# it; metadata files and block rounding are not counted), and files in /tmp
# share the volume. HEADROOM_FRACTION of the limit, and never less than
# MIN_HEADROOM bytes, is left for that.
HEADROOM_FRACTION = 0.10
MIN_HEADROOM = 256 * 1024 ** 2
MIN_SIZE = 1024 ** 3

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_QUANTITY_UNITS = {None: 1, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4, "P": 1000 ** 5,
                   "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "Pi": 1024 ** 5}

# The startup probe: the sidecar listens on the pod's loopback only (it is
# no cache for other pods), and an httpGet probe connects to the pod IP from
# the node, so the probe runs in the container, with the image's Python.
PROBE_COMMAND = ("python", "-c",
                 "import sys, urllib.request as u; "
                 f"r = u.build_opener(u.ProxyHandler({{}})).open('http://{LOOPBACK}:{HTTP_PORT}/readyz', timeout=2); "
                 "sys.exit(0 if r.status == 200 else 1)")


@dataclass(frozen=True)
class SidecarConfig:
    """What the webhook's settings say about sidecars (the chart's `webhook.sidecar` values)."""

    image: str | None  # None: the sidecar model is not available; pods asking for it stay centralized
    parent: str  # the cluster Service's URL, the sidecar's --parent
    size: str = "10Gi"  # the data volume's default sizeLimit
    resources: Mapping[str, Any] = field(default_factory=dict)
    by_annotation: bool = True  # may a pod choose `sidecar` with the annotation?
    origins: Mapping[str, str] = field(default_factory=dict)  # host -> upstream; missing: http://host
    pull_policy: str = "IfNotPresent"
    # The API server's version as (major, minor), read from discovery; None: not known (yet).
    server_version: tuple[int, int] | None = None


@dataclass
class Choice:
    """The model of one pod: per rule name, and why a sidecar asked for was not given."""

    by_rule: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    fallback: str | None = None  # set when some rule or annotation asked for a sidecar and it cannot be had


def quantity_bytes(text: str) -> int | None:
    """Bytes in a Kubernetes quantity of the forms a sizeLimit takes (10Gi, 500M, 1e9 is not one); None if not."""
    m = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if not m:
        return None
    return int(float(m.group(1)) * _QUANTITY_UNITS[m.group(2)])


def capacity_for(size_bytes: int) -> int:
    """The sidecar's --capacity for a volume of `size_bytes`: below it by the headroom explained above."""
    return size_bytes - max(int(size_bytes * HEADROOM_FRACTION), MIN_HEADROOM)


def workers_for(resources: Mapping[str, Any]) -> int:
    """The sidecar's --workers: its CPU limit, rounded up, else 1 (the chart's
    rule for the cluster's nodes, nezha.cacheWorkers). Never `auto`: a
    sidecar without a CPU limit sees every CPU of a GPU node (96 to 192),
    and that many workers of about 70 MiB would not fit its memory limit."""
    cpu = str((resources.get("limits") or {}).get("cpu", "")).strip()
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?)(m?)$", cpu)
    if not m:
        return 1
    millicores = math.ceil(float(m.group(1)) * (1 if m.group(2) else 1000))
    return max(1, -(-millicores // 1000))


def parse_version(major: Any, minor: Any) -> tuple[int, int] | None:
    """(major, minor) from /version's strings; providers append to minor ("28+"). None when not numbers."""
    digits = [re.match(r"^\d+", str(x or "")) for x in (major, minor)]
    if not all(digits):
        return None
    return int(digits[0].group(0)), int(digits[1].group(0))


def native_sidecars(version: tuple[int, int] | None) -> bool:
    return version is not None and version >= NATIVE_SIDECARS_SINCE


def choose(*, rules: list, annotations: Mapping[str, str], spec: Mapping[str, Any],
           config: SidecarConfig | None) -> Choice:
    """The deployment model of each matched rule for this pod.

    The annotation `nezha.io/deployment` overrides every matched rule;
    `centralized` is always honoured, `sidecar` only when the settings let
    pods choose it. An invalid value is named in a warning and ignored.
    When a sidecar is asked for and cannot be had (no native sidecars in
    this cluster, no image configured, a hostNetwork pod, ...), the pod is
    centralized and `fallback` says why, for the log and `nezha.io/status`.
    """
    choice = Choice(by_rule={r.name: r.deployment for r in rules})
    if str(annotations.get(STATUS_ANNOTATION, "")).startswith(f"{CENTRALIZED}:"):
        # Decided already, for the workload template this pod was made from (or an earlier pass): a pod
        # admitted once the server's version is known must not get a sidecar its template's aliases bypass.
        choice.by_rule = {name: CENTRALIZED for name in choice.by_rule}
        return choice
    asked = annotations.get(DEPLOYMENT_ANNOTATION)
    if asked is not None:
        if asked not in DEPLOYMENTS:
            choice.warnings.append(f"annotation {DEPLOYMENT_ANNOTATION} is {_short(asked)}; expected one of "
                                   f"{', '.join(DEPLOYMENTS)}; ignored, the rules' deployment is used")
        elif asked == SIDECAR and config is not None and not config.by_annotation:
            choice.warnings.append(f"annotation {DEPLOYMENT_ANNOTATION} is \"sidecar\", which the webhook's "
                                   "settings do not let a pod choose (sidecar_by_annotation); ignored")
        else:
            choice.by_rule = {name: asked for name in choice.by_rule}
    if SIDECAR not in choice.by_rule.values():
        return choice
    why = _unavailable(spec, config)
    if why is not None:
        choice.fallback = why
        choice.by_rule = {name: CENTRALIZED for name in choice.by_rule}
    return choice


def _unavailable(spec: Mapping[str, Any], config: SidecarConfig | None) -> str | None:
    if config is None or not config.image:
        return "no sidecar image is configured (sidecar_image)"
    if config.server_version is None:
        return "the Kubernetes version is not known yet (discovery), and native sidecars need 1.29"
    if not native_sidecars(config.server_version):
        major, minor = config.server_version
        return f"Kubernetes {major}.{minor} has no native sidecars (restartable init containers need 1.29)"
    if spec.get("hostNetwork") is True:
        return (f"the pod uses hostNetwork: the sidecar's loopback would be the node's, and the sysctl {SYSCTL} "
                "is not allowed there")
    sc = spec.get("securityContext")
    for s in (sc.get("sysctls") if isinstance(sc, dict) else None) or []:
        if isinstance(s, dict) and s.get("name") == SYSCTL and str(s.get("value")) != "0":
            return f"the pod sets {SYSCTL} to {_short(str(s.get('value')))}, and the sidecar needs 0 to bind port 80"
    return None


def size_of(annotations: Mapping[str, str], config: SidecarConfig) -> tuple[str, list[str]]:
    """The data volume's sizeLimit: the annotation when valid (else a warning naming it), or the default."""
    asked = annotations.get(SIZE_ANNOTATION)
    if asked is None:
        return config.size, []
    size = quantity_bytes(asked)
    if size is None:
        return config.size, [f"annotation {SIZE_ANNOTATION} is {_short(asked)}, not a size such as 20Gi; "
                             f"the default {config.size} is used"]
    if size < MIN_SIZE:
        return config.size, [f"annotation {SIZE_ANNOTATION} is {_short(asked)}, below the 1Gi a sidecar needs "
                             f"(its headroom alone is {MIN_HEADROOM // 1024 ** 2}Mi); the default {config.size} "
                             "is used"]
    return asked.strip(), []


def container(*, config: SidecarConfig, hosts: list[str], size: str) -> dict[str, Any]:
    """The native sidecar: `nezha cache` on the pod's loopback, the cluster as its parent."""
    args = ["cache", f"--listen={LOOPBACK}:{HTTP_PORT}", f"--tls-listen={LOOPBACK}:{TLS_PORT}",
            f"--data-dir={DATA_MOUNT}", f"--capacity={capacity_for(quantity_bytes(size) or 0)}",
            f"--parent={config.parent}", f"--workers={workers_for(config.resources)}"]
    args += [f"--origin={h}={config.origins.get(h, f'http://{h}')}" for h in hosts]
    out: dict[str, Any] = {
        "name": CONTAINER,
        "image": config.image,
        "imagePullPolicy": config.pull_policy,
        "restartPolicy": "Always",
        "args": args,
        "startupProbe": {"exec": {"command": list(PROBE_COMMAND)}, "periodSeconds": 1, "timeoutSeconds": 3,
                         "failureThreshold": 300},
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": VOLUME, "mountPath": DATA_MOUNT, "subPath": "data"},
                         {"name": VOLUME, "mountPath": TMP_MOUNT, "subPath": "tmp"},
                         {"name": HOSTS_VOLUME, "mountPath": "/etc/hosts", "subPath": "hosts", "readOnly": True}],
    }
    if config.resources:
        out["resources"] = {k: dict(v) for k, v in config.resources.items()}
    return out


def volumes(size: str) -> list[dict[str, Any]]:
    """The data volume and the one holding the sidecar's /etc/hosts."""
    return [{"name": VOLUME, "emptyDir": {"sizeLimit": size}},
            {"name": HOSTS_VOLUME, "downwardAPI": {"items": [
                {"path": "hosts", "fieldRef": {"fieldPath": f"metadata.annotations['{HOSTS_ANNOTATION}']"}}]}}]


def _short(text: str, limit: int = 63) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
