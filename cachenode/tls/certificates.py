"""The certificates a cache node presents for HTTPS dataset hosts, minted on first use.

A node that terminates TLS for `storage.googleapis.com` must present a
certificate for exactly that name, signed by the Nezha CA that labelled pods
trust. It mints one the first time a client asks for the name, and only
for a name its origin table allows: the Traffic Server certifier signs
whatever SNI it is sent, which turns the cache into a CA for any name on
the internet. Leaves are ECDSA P-256, valid for days (not years), kept in
memory and on disk (so a restart reuses them), and replaced when they come
within `renew_days` of expiry or were signed by another CA. A replacement
only affects new handshakes: a connection keeps the context it began with.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
import tempfile
from pathlib import Path
from typing import Callable

import structlog
from cryptography import x509

from nezha.errors import ConfigError
from nezha.pki import Pair, make_serving, renewal_reason

log = structlog.get_logger("nezha.tls")

LEAF_DAYS = 7
RENEW_DAYS = 2


class NotAllowed(Exception):
    """A certificate was asked for a name that is not a configured origin."""


def load_ca(cert_path: Path, key_path: Path) -> Pair:
    """The CA from the files the node was given; ConfigError naming the file otherwise."""
    texts = {}
    for flag, path in (("--ca-cert", cert_path), ("--ca-key", key_path)):
        try:
            texts[flag] = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"{flag} {path}: cannot read it: {e.strerror or e}") from e
    try:
        pair = Pair.load(texts["--ca-cert"], texts["--ca-key"])
    except ValueError as e:
        raise ConfigError(f"--ca-cert {cert_path} / --ca-key {key_path}: not a PEM certificate and EC key: {e}") from e
    if pair.cert.public_key().public_numbers() != pair.key.public_key().public_numbers():
        raise ConfigError(f"--ca-key {key_path} is not the key of --ca-cert {cert_path}")
    try:
        is_ca = pair.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ConfigError(f"--ca-cert {cert_path} is not a CA certificate (no basicConstraints CA:TRUE); "
                          f"make one with `nezha ca init`")
    return pair


class Leaves:
    def __init__(self, ca: Pair, *, certificate_name: Callable[[str], str | None], folder: Path,
                 days: int = LEAF_DAYS, renew_days: int = RENEW_DAYS,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        """`certificate_name(sni)`: the name a leaf for `sni` is made for (the name itself, or the
        `*.domain` origin it falls under), None for a name outside the origin table."""
        self.ca = ca
        self.certificate_name = certificate_name
        self.folder = Path(folder)
        self.days = days
        self.renew_days = renew_days
        self._clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))
        self._contexts: dict[str, tuple[Pair, ssl.SSLContext]] = {}
        self.minted = 0

    def context_for(self, name: str) -> ssl.SSLContext:
        """A server context presenting a valid leaf for `name`; NotAllowed for a name outside the table."""
        asked = name.lower().rstrip(".")
        name = self.certificate_name(asked)
        if name is None:
            raise NotAllowed(f"{asked!r} is not a configured origin: no certificate is made for it")
        held = self._contexts.get(name)
        if held is not None and self._reason(held[0], name) is None:
            return held[1]
        pair = self._from_disk(name)
        if pair is None:
            pair = make_serving(self.ca, names=[name], now=self._clock(), days=self.days)
            self._to_disk(name, pair)
            self.minted += 1
            log.info("leaf_minted", name=name, expires=f"{pair.cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")
        context = self._context(pair)
        self._contexts[name] = (pair, context)
        return context

    def _reason(self, pair: Pair, name: str) -> str | None:
        return renewal_reason(pair, ca=self.ca, names=[name], now=self._clock(), renew_days=self.renew_days)

    def _path(self, name: str) -> Path:
        # A name from the origin table is a host name or *.domain: no "/" or "..", checked there.
        return self.folder / f"{name.replace('*', '_wildcard')}.pem"

    def _from_disk(self, name: str) -> Pair | None:
        try:
            text = self._path(name).read_bytes()
        except OSError:
            return None
        key_at = text.find(b"-----BEGIN PRIVATE KEY-----")
        try:
            pair = Pair.load(text[:key_at], text[key_at:])
        except ValueError:
            return None
        return pair if self._reason(pair, name) is None else None

    def _to_disk(self, name: str, pair: Pair) -> None:
        """Written whole or not at all (a temp file renamed), readable by the node only."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".part")
            with os.fdopen(fd, "wb") as f:
                f.write(pair.cert_pem + pair.key_pem)
            os.replace(tmp, self._path(name))
        except OSError as e:
            log.warning("leaf_not_saved", name=name, error=str(e))  # still served from memory

    @staticmethod
    def _context(pair: Pair) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.NamedTemporaryFile() as f:  # ssl loads chains from files only
            f.write(pair.cert_pem + pair.key_pem)
            f.flush()
            context.load_cert_chain(f.name)
        return context
