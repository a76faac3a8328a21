"""Pure: the patch being built (its operations and warnings), and the
checked reads of the untrusted object it is built against.

The object is untrusted input: every field read is type-checked, and one of
the wrong type raises PatchError naming its JSON Pointer, so the review allows
the object unchanged with that warning instead of failing with a TypeError.
Messages say what a value is in JSON terms (`kind_of`), never its repr, which
may be huge or deep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nezha.errors import NezhaError
from webhook import sidecar as sc


class PatchError(NezhaError):
    """The object cannot be patched (its shape is not a pod spec we understand)."""


class TooManyContainers(PatchError):
    """Env mode declines a pod with more than MAX_CONTAINERS containers
    (webhook/containers.py); the review allows it unpatched."""


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


def at(obj: Any, pointer: str) -> Any:
    """The value at a JSON Pointer made of plain tokens, or None when absent."""
    for token in pointer.strip("/").split("/"):
        if not token:
            continue
        if not isinstance(obj, dict):
            return None
        obj = obj.get(token)
    return obj


def kind_of(value: Any) -> str:
    """What a value of the wrong type is, in JSON terms; never its (possibly huge or deep) repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return f"the string {short(value)}"
    return "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__


def short(text: str, limit: int = 63) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def warn(out: "Patch", message: str) -> None:
    """Add a warning once, however many containers or rules raise it."""
    if message not in out._warned:
        out._warned.add(message)
        out.warnings.append(message)


def strdict(v: Any) -> dict[str, str]:
    return {k: x for k, x in v.items() if isinstance(k, str) and isinstance(x, str)} if isinstance(v, dict) else {}


def append(out: Patch, base: str, exists: bool, items: list[dict[str, Any]]) -> None:
    """Ops adding `items` to the list at `base`: one op making it, or one per item appended."""
    if not items:
        return
    if exists:
        out.ops.extend({"op": "add", "path": f"{base}/-", "value": e} for e in items)
    else:
        out.ops.append({"op": "add", "path": base, "value": items})


def containers(spec: dict, spec_path: str):
    """(path, container) of every init container and container, each checked to be a mapping.

    Not the Nezha sidecar (a pod made from a template patched already has
    it): it is the cache itself and takes neither proxy variables nor the CA.
    """
    for group in ("initContainers", "containers"):
        containers = spec.get(group)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise PatchError(f"{spec_path}/{group} is {kind_of(containers)}, not a list")
        for i, c in enumerate(containers):
            where = f"{spec_path}/{group}/{i}"
            if not isinstance(c, dict):
                raise PatchError(f"{where} is {kind_of(c)}, not a container")
            if group == "initContainers" and c.get("name") == sc.CONTAINER and c.get("restartPolicy") == "Always":
                continue
            yield where, c


def list_at(container: dict, where: str, field_name: str, what: str) -> list:
    value = container.get(field_name)
    if value is not None and not isinstance(value, list):
        raise PatchError(f"{where}/{field_name} is {kind_of(value)}, not a list")
    for j, item in enumerate(value or []):
        if not isinstance(item, dict):
            raise PatchError(f"{where}/{field_name}/{j} is {kind_of(item)}, not {what}")
    return value if value is not None else []


def env_of(container: dict, where: str) -> dict[str, Any]:
    """The container's own variables, name -> value (None when from valueFrom), each checked to be named."""
    env = list_at(container, where, "env", "a variable")
    for j, e in enumerate(env):
        if not isinstance(e.get("name"), str):
            raise PatchError(f"{where}/env/{j}/name is {kind_of(e.get('name'))}, not a variable name")
    return {e["name"]: e.get("value") for e in env}
