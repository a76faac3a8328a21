"""Leaf certificates for HTTPS dataset hosts: only for configured names, short-lived, reused, renewed (cachenode/tls/certificates.py)."""

from __future__ import annotations

import datetime as dt
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from cachenode.tls.certificates import Leaves, NotAllowed, load_ca
from nezha.config import Origin, OriginTable
from nezha.errors import ConfigError
from nezha.pki import make_ca, make_serving

NOW = dt.datetime.now(dt.timezone.utc)  # real time: the handshakes check validity against the clock
ORIGINS = {"storage.googleapis.com", "huggingface.co"}
TABLE = OriginTable([Origin(host=h, upstream=f"https://{h}") for h in ORIGINS]
                    + [Origin(host="*.s3.amazonaws.com", upstream="https://{host}")])


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def ca():
    return make_ca(now=NOW - dt.timedelta(days=10), name="nezha-ca")


def leaves_for(ca, tmp_path, clock=None):
    return Leaves(ca, certificate_name=TABLE.certificate_name, folder=tmp_path / "leaves", clock=clock or Clock())


def handshake(server: ssl.SSLContext, ca, name: str) -> dict:
    """A client that trusts only the CA completes a handshake with `server` for `name`; its view of the leaf."""
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    return c.getpeercert()


def leaf_of(leaves: Leaves, name: str) -> x509.Certificate:
    return leaves._contexts[name][0].cert


def test_a_configured_name_gets_a_short_lived_p256_leaf_for_exactly_that_name_that_clients_of_the_ca_accept(
        ca, tmp_path):
    leaves = leaves_for(ca, tmp_path)
    seen = handshake(leaves.context_for("Storage.GoogleAPIs.com."), ca, "storage.googleapis.com")
    assert seen["subjectAltName"] == (("DNS", "storage.googleapis.com"),)
    leaf = leaf_of(leaves, "storage.googleapis.com")
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey) and leaf.public_key().curve.name == "secp256r1"
    assert leaf.not_valid_after_utc - NOW <= dt.timedelta(days=7)
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_no_certificate_is_ever_made_for_a_name_outside_the_origin_table(ca, tmp_path):
    leaves = leaves_for(ca, tmp_path)
    for name in ("evil.example", "*.googleapis.com", "googleapis.com"):
        with pytest.raises(NotAllowed):
            leaves.context_for(name)
    assert leaves.minted == 0 and not (tmp_path / "leaves").exists()


def test_a_leaf_is_minted_once_and_a_restart_reuses_it_from_disk(ca, tmp_path):
    first = leaves_for(ca, tmp_path)
    first.context_for("huggingface.co")
    first.context_for("huggingface.co")
    assert first.minted == 1
    assert oct((tmp_path / "leaves" / "huggingface.co.pem").stat().st_mode & 0o777) == "0o600"
    again = leaves_for(ca, tmp_path)
    again.context_for("huggingface.co")
    assert again.minted == 0
    assert leaf_of(again, "huggingface.co").serial_number == leaf_of(first, "huggingface.co").serial_number


def test_a_leaf_near_expiry_is_replaced_for_new_handshakes(ca, tmp_path):
    clock = Clock()
    clock.now = NOW - dt.timedelta(days=5, hours=1)  # minted then, it is within two days of its end now
    leaves = leaves_for(ca, tmp_path, clock)
    old_context = leaves.context_for("huggingface.co")
    old = leaf_of(leaves, "huggingface.co")
    clock.now = NOW
    new_context = leaves.context_for("huggingface.co")
    assert leaves.minted == 2 and leaf_of(leaves, "huggingface.co").serial_number != old.serial_number
    assert handshake(old_context, ca, "huggingface.co")  # a connection that began on the old one keeps it
    assert handshake(new_context, ca, "huggingface.co")


def test_a_leaf_from_another_ca_is_not_reused(ca, tmp_path):
    leaves_for(ca, tmp_path).context_for("huggingface.co")
    other = make_ca(now=NOW - dt.timedelta(days=1), name="nezha-ca")
    fresh = leaves_for(other, tmp_path)
    handshake(fresh.context_for("huggingface.co"), other, "huggingface.co")
    assert fresh.minted == 1


def test_an_unreadable_or_broken_ca_is_one_error_naming_the_file(ca, tmp_path):
    cert, key = tmp_path / "ca.crt", tmp_path / "ca.key"
    cert.write_bytes(ca.cert_pem)
    with pytest.raises(ConfigError, match=r"--ca-key .*ca.key: cannot read it"):
        load_ca(cert, key)
    key.write_bytes(b"not a key")
    with pytest.raises(ConfigError, match="not a PEM certificate and EC key"):
        load_ca(cert, key)
    key.write_bytes(ca.key_pem)
    assert load_ca(cert, key).cert.serial_number == ca.cert.serial_number


def test_a_key_of_another_ca_or_a_certificate_that_is_no_ca_is_refused(ca, tmp_path):
    cert, key = tmp_path / "ca.crt", tmp_path / "ca.key"
    other = make_ca(now=NOW, name="nezha-ca")
    cert.write_bytes(ca.cert_pem)
    key.write_bytes(other.key_pem)
    with pytest.raises(ConfigError, match=r"--ca-key .* is not the key of --ca-cert"):
        load_ca(cert, key)
    leaf = make_serving(ca, names=["huggingface.co"], now=NOW, days=7)
    cert.write_bytes(leaf.cert_pem)
    key.write_bytes(leaf.key_pem)
    with pytest.raises(ConfigError, match="is not a CA certificate"):
        load_ca(cert, key)


def test_a_name_under_a_wildcard_origin_gets_the_wildcard_leaf_and_one_deeper_gets_none(ca, tmp_path):
    leaves = leaves_for(ca, tmp_path)
    seen = handshake(leaves.context_for("datasets.s3.amazonaws.com"), ca, "datasets.s3.amazonaws.com")
    assert seen["subjectAltName"] == (("DNS", "*.s3.amazonaws.com"),)
    handshake(leaves.context_for("other-bucket.s3.amazonaws.com"), ca, "other-bucket.s3.amazonaws.com")
    assert leaves.minted == 1  # one leaf for the pattern, as the entry is one
    with pytest.raises(NotAllowed):
        leaves.context_for("a.b.s3.amazonaws.com")  # a wildcard covers one label, and so does the table
    with pytest.raises(NotAllowed):
        leaves.context_for("s3.amazonaws.com")
    assert (tmp_path / "leaves" / "_wildcard.s3.amazonaws.com.pem").exists()


def test_an_exact_origin_never_gets_a_wildcard_leaf(ca, tmp_path):
    seen = handshake(leaves_for(ca, tmp_path).context_for("huggingface.co"), ca, "huggingface.co")
    assert seen["subjectAltName"] == (("DNS", "huggingface.co"),)
