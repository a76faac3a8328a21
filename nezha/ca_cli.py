"""`nezha ca init`: the CA whose leaves cache nodes present for HTTPS dataset hosts.

In a cluster (`--namespace`): the key in Secret `nezha-ca-key`, which only
cache pods will mount, and the certificate in ConfigMap `nezha-ca`, with
the bundle pods are given: the system's public roots plus the Nezha CA
(the variables most clients read *replace* their roots, so the bundle must
carry the public ones too). Locally (`--local DIR`): DIR/ca.crt and
DIR/ca.key.

Made once and kept: every pod that trusts it would break if it changed
under them, so a run that finds a valid CA writes nothing, and one that
finds half a CA or a broken one says so and changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import os
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nezha import trust_bundle
from nezha.config import CaInitSettings, load
from nezha.config.flags import add_settings, given
from nezha.errors import ConfigError, RunError
from nezha.logs import configure

if TYPE_CHECKING:
    from nezha.pki import Pair

CA_NAME = "nezha-ca"
SECRET = "nezha-ca-key"  # the key: cache pods only
CONFIGMAP = trust_bundle.CONFIGMAP  # the certificate and the pods' bundle: anyone may read it
RENEW_DAYS = 30
LABELS = {"app.kubernetes.io/name": "nezha", "app.kubernetes.io/component": "ca"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ca", help="the CA for HTTPS dataset hosts")
    actions = p.add_subparsers(dest="ca_command", metavar="ACTION")
    actions.required = True
    init = actions.add_parser("init", help="create the CA once (idempotent)",
                              description="Create the CA cache nodes sign dataset hosts' certificates with: "
                                          "DIR/ca.crt (give it to clients) and DIR/ca.key (only cache nodes may "
                                          "read it, mode 0600). A valid CA already there is kept.")
    add_settings(init, CaInitSettings, command="ca init")
    init.set_defaults(func=run_init)


def init_local(folder: Path, *, now: dt.datetime | None = None) -> tuple[Pair, bool]:
    """The CA in `folder`, and whether this call created it."""
    # Here, not at the top: every `nezha` command builds this command's parser,
    # and a cache node's workers should not import cryptography for it.
    from nezha.pki import Pair, make_ca, renewal_reason

    now = now or dt.datetime.now(dt.timezone.utc)
    cert_path, key_path = folder / "ca.crt", folder / "ca.key"
    present = [p for p in (cert_path, key_path) if p.exists()]
    if len(present) == 1:
        missing = key_path if present[0] == cert_path else cert_path
        raise RunError(f"{present[0]} exists but {missing} does not: refusing to replace half a CA that clients "
                       f"may trust; restore it or remove both files")
    if present:
        try:
            pair = Pair.load(cert_path.read_bytes(), key_path.read_bytes())
        except (OSError, ValueError) as e:
            raise RunError(f"cannot read the CA in {folder}: {e}") from e
        reason = renewal_reason(pair, now=now, renew_days=RENEW_DAYS)
        if reason is not None:
            raise RunError(f"the CA in {folder} cannot be kept ({reason}); rotating it is deliberate: "
                           f"see docs/https.md")
        return pair, False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        pair = make_ca(now=now, name=CA_NAME)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pair.key_pem)
        cert_path.write_bytes(pair.cert_pem)
    except OSError as e:
        raise RunError(f"cannot write the CA to {folder}: {e.strerror or e}") from e
    return pair, True


def system_roots() -> bytes:
    """The public roots of this machine (or image), for the pods' bundle."""
    path = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    try:
        roots = Path(path).read_bytes()
    except OSError as e:
        raise RunError(f"no system CA bundle at {path} ({e.strerror or e}): the pods' bundle must carry the "
                       f"public roots too; install ca-certificates") from e
    if b"-----BEGIN CERTIFICATE-----" not in roots:
        raise RunError(f"{path} holds no certificate: the pods' bundle must carry the public roots too")
    return roots if roots.endswith(b"\n") else roots + b"\n"


async def init_in_cluster(api, namespace: str, *, now: dt.datetime | None = None) -> str:
    """Create the CA once in `namespace`; one line saying what was done."""
    from kubernetes_asyncio import client

    now = now or dt.datetime.now(dt.timezone.utc)
    core = client.CoreV1Api(api)
    secret = await _read(core, namespace, "secret", SECRET)
    configmap = await _read(core, namespace, "config_map", CONFIGMAP)
    done = []
    pair, created = await _the_ca(core, namespace, secret, configmap, now=now)
    if created:
        done.append(f"created the CA in Secret {SECRET}")
    if await _write_bundle(core, namespace, configmap, pair):
        done.append(f"wrote the certificate and the pods' bundle to ConfigMap {CONFIGMAP}")
    expires = f"{pair.cert.not_valid_after_utc:%Y-%m-%d}"
    if not done:
        return f"kept the CA in {namespace} (expires {expires}); nothing to do"
    return f"{'; '.join(done)} in {namespace} (expires {expires})"


async def _read(core, namespace: str, kind: str, name: str):
    """The object `kind` `name` in `namespace`, or None when there is none."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        return await getattr(core, f"read_namespaced_{kind}")(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise RunError(f"cannot read {kind} {namespace}/{name}: {e.status} {e.reason}") from e


async def _the_ca(core, namespace: str, secret, configmap, *, now: dt.datetime) -> tuple[Pair, bool]:
    """The CA the Secret holds, made and stored first when there is none; and
    whether this call stored it. A run that lost the race to create it uses
    the one the other run stored."""
    from nezha.pki import make_ca

    if secret is None:
        if configmap is not None and (configmap.data or {}).get("ca.crt"):
            raise RunError(f"ConfigMap {namespace}/{CONFIGMAP} holds a CA whose key Secret {SECRET} is gone: "
                           f"refusing to replace a CA pods may trust; restore the Secret, or delete the "
                           f"ConfigMap to start over")
        pair = make_ca(now=now, name=CA_NAME)
        secret = await _create_secret(core, namespace, pair)
        if secret is None:
            return pair, True
    return _kept_ca(secret, namespace, now=now), False


async def _create_secret(core, namespace: str, pair: Pair):
    """Store `pair` in the Secret: None once stored, or the Secret another run stored first."""
    from kubernetes_asyncio.client.exceptions import ApiException

    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": namespace, "labels": LABELS},
            "data": {"ca.crt": base64.b64encode(pair.cert_pem).decode(),
                     "ca.key": base64.b64encode(pair.key_pem).decode()}}
    try:
        await core.create_namespaced_secret(namespace, body)
        return None
    except ApiException as e:
        if e.status != 409:
            raise RunError(f"cannot create Secret {namespace}/{SECRET}: {e.status} {e.reason}") from e
    secret = await _read(core, namespace, "secret", SECRET)  # another run made it first: use theirs
    if secret is None:
        raise RunError(f"Secret {namespace}/{SECRET} was created and deleted under this run; run it again")
    return secret


def _kept_ca(secret, namespace: str, *, now: dt.datetime) -> Pair:
    """The CA in `secret`, if it is whole and may be kept."""
    from nezha.pki import Pair, renewal_reason

    data = secret.data or {}
    try:
        pair = Pair.load(base64.b64decode(data.get("ca.crt", "")), base64.b64decode(data.get("ca.key", "")))
    except ValueError as e:
        raise RunError(f"Secret {namespace}/{SECRET} does not hold a CA (ca.crt, ca.key): {e}") from e
    if (why := renewal_reason(pair, now=now, renew_days=RENEW_DAYS)) is not None:
        raise RunError(f"the CA in Secret {namespace}/{SECRET} cannot be kept ({why}); rotating it is "
                       f"deliberate: see docs/https.md")
    return pair


async def _write_bundle(core, namespace: str, configmap, pair: Pair) -> bool:
    """Write the certificate and the pods' bundle to the ConfigMap unless it
    holds them already; whether it wrote."""
    from kubernetes_asyncio.client.exceptions import ApiException

    cert = pair.cert_pem.decode()
    held = (configmap.data or {}) if configmap is not None else {}
    # Rewritten when the CA differs or a file is missing (one written by an older
    # version); not for roots that differ by machine, which would churn every run.
    if held.get(trust_bundle.CA_FILE) == cert and set(trust_bundle.files(b"", b"")) <= set(held):
        return False
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP, "namespace": namespace, "labels": LABELS},
            "data": trust_bundle.files(pair.cert_pem, system_roots())}
    try:
        if configmap is None:
            await core.create_namespaced_config_map(namespace, body)
        else:
            body["metadata"]["resourceVersion"] = configmap.metadata.resource_version
            await core.replace_namespaced_config_map(CONFIGMAP, namespace, body)
    except ApiException as e:
        raise RunError(f"cannot write ConfigMap {namespace}/{CONFIGMAP}: {e.status} {e.reason}") from e
    return True


def run_init(args: argparse.Namespace) -> int:
    settings = load(CaInitSettings, config_file=args.config, flags=given(args))
    configure(level=settings.quiet_log_level(), stream=sys.stderr)
    if settings.namespace is not None:
        from nezha.kube import api_client

        async def main() -> str:
            api = await api_client(kubeconfig=settings.kubeconfig, hint="pass --kubeconfig (or use --local DIR)")
            try:
                return await init_in_cluster(api, settings.namespace)
            finally:
                await api.close()

        print(asyncio.run(main()))
        return 0
    local = settings.local
    assert local is not None  # CaInitSettings holds one of the two
    if local.exists() and not local.is_dir():
        raise ConfigError(f"--local {str(local)!r}: exists and is not a folder; the CA goes into a folder "
                          f"as ca.crt and ca.key")
    pair, created = init_local(local)
    print(f"{'created' if created else 'kept'} {local / 'ca.crt'} (expires "
          f"{pair.cert.not_valid_after_utc:%Y-%m-%d}); key {local / 'ca.key'}, readable by its owner only")
    return 0
