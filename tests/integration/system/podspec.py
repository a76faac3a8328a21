"""A container as the kubelet would start it, computed from its pod (pure).

What the whole-system test runs is what the chart says: the container's
`command`/`args`/`env`, with Kubernetes' `$(VAR)` expansion and the
downward API, secret and config map references resolved. Two stand-ins, no
more:

- The image's entrypoint is the program of this checkout (`nezha` for the
  Nezha image, `redis-server` from PATH for Redis).
- Volumes are directories on this machine, and paths under a volume's
  mountPath in args and env are rewritten to them (a container runtime
  would mount them instead). A path that lies under no volume is refused:
  with readOnlyRootFilesystem the container could not write there, and
  nothing else of the image is here to read.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ is a literal $, unknown names stay as written."""
    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REF.sub(one, text)


class Unresolvable(Exception):
    """The container cannot start yet: a Secret or ConfigMap it names does not exist (ContainerCreating)."""


@dataclass
class Container:
    argv: list[str]
    env: dict[str, str]
    mounts: dict[str, Path] = field(default_factory=dict)


def field_ref(pod: dict, path: str) -> str:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    values = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "status.podIP": status.get("podIP"),
              "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
              "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName")}
    if path not in values or values[path] is None:
        raise Unresolvable(f"fieldRef {path} has no value yet")
    return str(values[path])


def resolve_env(pod: dict, container: dict, *, secret: Callable[[str], dict | None],
                configmap: Callable[[str], dict | None]) -> dict[str, str]:
    """The container's environment in order, each value expanded against those before it."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        src = item.get("valueFrom") or {}
        if "fieldRef" in src:
            env[name] = field_ref(pod, src["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            obj = secret(ref["name"])
            if obj is None or ref["key"] not in (obj.get("data") or {}):
                if ref.get("optional"):
                    continue
                raise Unresolvable(f"secret {ref['name']} key {ref['key']}")
            env[name] = base64.b64decode(obj["data"][ref["key"]]).decode()
        elif "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            obj = configmap(ref["name"])
            if obj is None or ref["key"] not in (obj.get("data") or {}):
                if ref.get("optional"):
                    continue
                raise Unresolvable(f"configmap {ref['name']} key {ref['key']}")
            env[name] = obj["data"][ref["key"]]
        else:
            raise ValueError(f"env {name}: unsupported source {sorted(src)}")
    return env


def remap(text: str, mounts: dict[str, Path]) -> str:
    """`text` with a leading container path under a mountPath replaced by its directory here."""
    for mount in sorted(mounts, key=len, reverse=True):
        if text == mount or text.startswith(mount.rstrip("/") + "/"):
            return str(mounts[mount]) + text[len(mount.rstrip("/")):]
    return text


def remap_arg(arg: str, mounts: dict[str, Path]) -> str:
    """An argument `PATH` or `--flag=PATH`; refuses an absolute path under no volume."""
    prefix, sep, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if not value.startswith("/"):
        return arg
    mapped = remap(value, mounts)
    if mapped == value:
        raise ValueError(f"argument {arg!r} names {value}, which is on no volume of the container "
                         f"(mounts: {sorted(mounts)})")
    return f"{prefix}{sep}{mapped}"


def container_argv(container: dict, env: dict[str, str], mounts: dict[str, Path], *,
                   entrypoints: dict[str, list[str]]) -> list[str]:
    """command (else the image's entrypoint) + args, expanded and remapped."""
    image = container["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1]
    command = container.get("command")
    if command:
        program = [entrypoints.get(command[0], [command[0]])[0], *command[1:]]
    else:
        if image not in entrypoints:
            raise ValueError(f"no entrypoint known for image {container['image']}")
        program = list(entrypoints[image])
    args = [expand(a, env) for a in container.get("args") or []]
    return program + [remap_arg(a, mounts) for a in args]
