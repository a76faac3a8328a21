"""Kubernetes' protobuf encoding, decoded for the few built-in kinds clients send that way.

client-go's typed clients (`kubectl create namespace`, Helm's release
Secrets) send `application/vnd.kubernetes.protobuf` bodies, and
kube-apiserver takes them. The double decodes what those clients send:
Secrets, Namespaces and ConfigMaps with their ObjectMeta (field numbers
from k8s.io/api generated.proto). Responses stay JSON, which every client
accepts.

The envelope (k8s.io/apimachinery runtime.Unknown): the magic `k8s\\0`, then
Unknown{typeMeta=1{apiVersion=1, kind=2}, raw=2, contentEncoding=3, contentType=4}.
"""

from __future__ import annotations

import base64
from typing import Any, Iterator

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    pass


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value): ints for varints, bytes for length-delimited."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ProtobufError("truncated field")
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        yield number, wire, value


def _map_entry(buf: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, _, v in fields(buf):
        if number == 1:
            key = v.decode()
        elif number == 2:
            value = v
    return key, value


def _meta(buf: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    names = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for number, _, v in fields(buf):
        if number in names:
            meta[names[number]] = v.decode()
        elif number == 11:
            k, val = _map_entry(v)
            meta.setdefault("labels", {})[k] = val.decode()
        elif number == 12:
            k, val = _map_entry(v)
            meta.setdefault("annotations", {})[k] = val.decode()
        elif number == 14:
            meta.setdefault("finalizers", []).append(v.decode())
    return meta


def _secret(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, wire, v in fields(buf):
        if number == 1:
            obj["metadata"] = _meta(v)
        elif number == 2:
            k, val = _map_entry(v)
            obj.setdefault("data", {})[k] = base64.b64encode(val).decode()
        elif number == 3:
            obj["type"] = v.decode()
        elif number == 4:
            k, val = _map_entry(v)
            obj.setdefault("stringData", {})[k] = val.decode()
        elif number == 5:
            obj["immutable"] = bool(v)
    return obj


def _configmap(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, _, v in fields(buf):
        if number == 1:
            obj["metadata"] = _meta(v)
        elif number == 2:
            k, val = _map_entry(v)
            obj.setdefault("data", {})[k] = val.decode()
        elif number == 3:
            k, val = _map_entry(v)
            obj.setdefault("binaryData", {})[k] = base64.b64encode(val).decode()
    return obj


def _namespace(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, _, v in fields(buf):
        if number == 1:
            obj["metadata"] = _meta(v)
    return obj


DECODERS = {("v1", "Secret"): _secret, ("v1", "ConfigMap"): _configmap, ("v1", "Namespace"): _namespace}


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object; ProtobufError for a kind the double does not decode."""
    if not body.startswith(MAGIC):
        raise ProtobufError("no k8s protobuf envelope")
    api_version = kind = ""
    raw = b""
    for number, _, v in fields(body[len(MAGIC):]):
        if number == 1:
            for n, _, tv in fields(v):
                if n == 1:
                    api_version = tv.decode()
                elif n == 2:
                    kind = tv.decode()
        elif number == 2:
            raw = v
    decoder = DECODERS.get((api_version, kind))
    if decoder is None:
        raise ProtobufError(f"the double decodes no protobuf {api_version} {kind}")
    obj = decoder(raw)
    obj.update(apiVersion=api_version, kind=kind)
    return obj
