"""Certificates Nezha makes: CAs, and serving certificates they sign. No I/O: callers keep the files.

Shared by the webhook (its own CA and serving certificate, webhook/certs.py)
and by `nezha ca` (the CA whose leaves cache nodes present for dataset
hosts). ECDSA P-256 throughout: small keys, fast handshakes, and what every
client this project meets accepts.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650


@dataclass
class Pair:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> "Pair":
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("key is not an EC key")
        return cls(x509.load_pem_x509_certificate(cert_pem), key)


def make_ca(*, now: dt.datetime, days: int = CA_DAYS, name: str = "nezha-webhook-ca") -> Pair:
    """A CA that signs leaves only (path length 0), named `name` and when it was made."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-{now:%Y%m%d%H%M%S}")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Pair(cert, key)


def make_serving(ca: Pair, *, names: list[str], now: dt.datetime, days: int) -> Pair:
    """An ECDSA P-256 serving certificate for exactly `names` (SANs), signed by `ca`."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-2] if len(names) > 1
                                                        else names[0])]))
            .issuer_name(ca.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return Pair(cert, key)


def renewal_reason(pair: Pair | None, *, ca: Pair | None = None, names: list[str] | None = None,
                   now: dt.datetime, renew_days: int) -> str | None:
    """Why `pair` must be replaced, or None when it is good for more than `renew_days`."""
    if pair is None:
        return "missing"
    if pair.cert.public_key().public_numbers() != pair.key.public_key().public_numbers():
        return "key does not match certificate"
    left = pair.cert.not_valid_after_utc - now
    if left < dt.timedelta(days=renew_days):
        return f"expires {pair.cert.not_valid_after_utc:%Y-%m-%d}, within {renew_days} days"
    if ca is not None:
        try:
            pair.cert.verify_directly_issued_by(ca.cert)
        except (InvalidSignature, ValueError, TypeError):
            return "not signed by the current CA"
    if names is not None:
        try:
            have = set(pair.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
                       .value.get_values_for_type(x509.DNSName))
        except x509.ExtensionNotFound:
            have = set()
        if missing := [n for n in names if n not in have]:
            return f"lacks DNS name {missing[0]}"
    return None
