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

Lists of objects that all carry `name` (containers, env, ports, volumes,
a MutatingWebhookConfiguration's webhooks) are maps keyed by name, as
their patchMergeKey makes them in the real API: two managers can own
different fields of one item (Helm the webhook's rules, the certificates
Job its caBundle). Other lists are atomic, as `x-kubernetes-list-type:
atomic` ones are.
"""

from __future__ import annotations

import copy
from typing import Any

Path = tuple[str, ...]
Owners = dict[str, set[Path]]

# Set by the server, never owned by a client.
_IGNORED = {("apiVersion",), ("kind",), ("status",)}
_META_OWNED = ("labels", "annotations")


def _keyed(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(i, dict) and "name" in i for i in value)


def _item(name: Any) -> str:
    return f"[name={name}]"


def leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf field by path; empty objects and lists not keyed by name are leaves."""
    if isinstance(obj, dict) and obj:
        out: dict[Path, Any] = {}
        for k, v in obj.items():
            out.update(leaves(v, prefix + (k,)))
        return out
    if _keyed(obj):
        out = {}
        for item in obj:
            out.update(leaves(item, prefix + (_item(item["name"]),)))
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


def _child(container: Any, k: str, *, create: bool, next_is_item: bool = False) -> Any:
    """The value under `k` of a dict, or the item named in `k` of a keyed list (made when `create`)."""
    if k.startswith("[name="):
        if not isinstance(container, list):
            return _MISSING
        name = k[len("[name="):-1]
        for item in container:
            if isinstance(item, dict) and str(item.get("name")) == name:
                return item
        if not create:
            return _MISSING
        container.append({"name": name})
        return container[-1]
    if not isinstance(container, dict):
        return _MISSING
    if k not in container or not isinstance(container[k], (dict, list)):
        if not create:
            return container.get(k, _MISSING)
        container[k] = [] if next_is_item else {}
    return container[k]


def get(obj: Any, path: Path) -> Any:
    for k in path:
        obj = _child(obj, k, create=False)
        if obj is _MISSING:
            return _MISSING
    return obj


def put(obj: dict, path: Path, value: Any) -> None:
    for i, k in enumerate(path[:-1]):
        obj = _child(obj, k, create=True, next_is_item=path[i + 1].startswith("[name="))
    last = path[-1]
    if last.startswith("[name="):  # a whole item (it had no other field): make sure it is there
        _child(obj, last, create=True)
        return
    obj[last] = copy.deepcopy(value)


def drop(obj: dict, path: Path) -> None:
    parents = []
    for k in path[:-1]:
        child = _child(obj, k, create=False)
        if child is _MISSING or not isinstance(child, (dict, list)):
            return
        parents.append((obj, k, child))
        obj = child
    if isinstance(obj, dict):
        obj.pop(path[-1], None)
    for parent, k, child in reversed(parents):  # an emptied object, or an item left with only its name, goes
        if k.startswith("[name="):
            if set(child) <= {"name"}:
                parent.remove(child)
        elif child in ({}, []):
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
