"""Server-side apply and field ownership, as much of kube-apiserver's as Helm 4 and kubectl rely on (pure).

Every write records who set which fields: an apply owns exactly the fields
of its configuration; any other write (create, update, patch, the scale
subresource) takes the fields whose values it changed, from whoever held
them. An apply then

- conflicts (409) on a field whose value it would change while another
  manager owns it, unless forced, which moves the field to it;
- removes a field it owned before and no longer sets, unless another
  manager owns it too;
- shares a field it sets to the value it already has.

Simplification, stated: lists are atomic (the real API merges lists of
containers, ports, env and volumes by key). Nezha's chart and tests never
have two managers on one list.
"""

from __future__ import annotations

import copy
from typing import Any

Path = tuple[str, ...]
Owners = dict[str, set[Path]]

# Set by the server, never owned by a client.
_IGNORED = {("apiVersion",), ("kind",), ("status",)}
_META_OWNED = ("labels", "annotations")


def leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf field by path; lists and empty objects are leaves."""
    if isinstance(obj, dict) and obj:
        out: dict[Path, Any] = {}
        for k, v in obj.items():
            out.update(leaves(v, prefix + (k,)))
        return out
    return {prefix: obj}


def fields_of(obj: dict) -> dict[Path, Any]:
    """The fields a client can own: everything but type, status and metadata other than labels and annotations."""
    out = {}
    for path, value in leaves(obj).items():
        if path[:1] in {("apiVersion",), ("kind",), ("status",)}:
            continue
        if path[0] == "metadata" and (len(path) < 3 or path[1] not in _META_OWNED):
            continue
        out[path] = value
    return out


_MISSING = object()


def get(obj: Any, path: Path) -> Any:
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return _MISSING
        obj = obj[k]
    return obj


def put(obj: dict, path: Path, value: Any) -> None:
    for k in path[:-1]:
        if not isinstance(obj.get(k), dict):
            obj[k] = {}
        obj = obj[k]
    obj[path[-1]] = copy.deepcopy(value)


def drop(obj: dict, path: Path) -> None:
    parents = []
    for k in path[:-1]:
        if not isinstance(obj.get(k), dict):
            return
        parents.append((obj, k))
        obj = obj[k]
    obj.pop(path[-1], None)
    for parent, k in reversed(parents):  # an emptied object goes too
        if parent[k] == {}:
            del parent[k]


class Conflict(Exception):
    def __init__(self, conflicts: list[tuple[str, Path]]) -> None:
        self.conflicts = conflicts
        super().__init__(conflicts)


def record_write(owners: Owners, manager: str, old: dict | None, new: dict) -> Owners:
    """Ownership after a non-apply write: the writer takes the fields it changed (all of them on create)."""
    before = fields_of(old) if old is not None else {}
    after = fields_of(new)
    changed = {p for p, v in after.items() if before.get(p, _MISSING) != v}
    out = {m: {p for p in paths if p in after and p not in changed} for m, paths in owners.items()}
    out.setdefault(manager, set()).update(changed)
    return {m: paths for m, paths in out.items() if paths}


def apply(live: dict, config: dict, owners: Owners, manager: str, *, force: bool) -> tuple[dict, Owners]:
    """The object and ownership after `manager` applies `config` to `live`; Conflict unless `force`."""
    wanted = fields_of(config)
    current = fields_of(live)
    conflicts = []
    for path, value in wanted.items():
        if current.get(path, _MISSING) == value:
            continue
        for other, paths in owners.items():
            if other != manager and path in paths:
                conflicts.append((other, path))
    if conflicts and not force:
        raise Conflict(conflicts)
    out: Owners = {m: set(paths) for m, paths in owners.items()}
    if force:
        for other, path in conflicts:
            out[other].discard(path)
    new = copy.deepcopy(live)
    for path in out.get(manager, set()) - set(wanted):
        if not any(path in paths for m, paths in out.items() if m != manager):
            drop(new, path)
    for path, value in wanted.items():
        # A path below a leaf another value held (a list becoming an object) replaces it.
        put(new, path, value)
    out[manager] = set(wanted)
    return new, {m: paths for m, paths in out.items() if paths}


def conflict_message(kind: str, api_version: str, conflicts: list[tuple[str, Path]]) -> str:
    parts = [f'conflict with "{m}" using {api_version}: .{".".join(p)}' for m, p in conflicts]
    n = len(parts)
    return f"Apply failed with {n} conflict{'s' if n > 1 else ''}: " + "\n".join(parts)
