"""A running webhook follows its rules file and certificate pair without a restart."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest
import trustme
from cryptography import x509
from structlog.testing import capture_logs

from nezha.config import WebhookSettings
from testkit.ports import free_port
from tests.integration.webhook.conftest import RULES
from tests.integration.webhook.reviews import patched, pod, review
from webhook.server import build_webhook, start


async def eventually(check, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{check.__name__} stayed false for {timeout} s")
        await asyncio.sleep(0.05)


async def aliases(client, webhook, obj=None):
    obj = obj or pod()
    async with client.post(f"{webhook.url}/mutate", json=review(obj)) as r:
        assert r.status == 200
        return patched(obj, await r.json())["spec"].get("hostAliases")


async def test_a_changed_rules_file_is_used_for_the_next_review(webhook, client, rules_file):
    assert (await aliases(client, webhook))[0]["ip"] == "10.106.122.174"
    rules_file.write_text(rules_file.read_text().replace("10.106.122.174", "10.1.2.3"))

    async def new_ip():
        return (await aliases(client, webhook))[0]["ip"] == "10.1.2.3"

    await eventually(new_ip)


async def test_a_broken_rules_file_is_reported_and_the_previous_rules_stay(webhook, client, rules_file):
    with capture_logs() as logs:
        rules_file.write_text("- name: dataset\n  app: [unclosed\n")

        async def reported():
            async with client.get(f"{webhook.url}/healthz") as r:
                return (await r.json())["rules_error"]

        error = await eventually(reported)
    assert "not valid YAML" in error
    assert any(e["event"] == "rules_reload_failed" and e["kept"] == 1 for e in logs)
    assert (await aliases(client, webhook))[0]["ip"] == "10.106.122.174"

    rules_file.write_text("- {name: other, app: team, label: ml, hostAliases: [{ip: 10.9.9.9, hostnames: [a.example]}]}\n")

    async def recovered():
        return await aliases(client, webhook, pod(labels={"team": "ml"})) == [{"ip": "10.9.9.9",
                                                                             "hostnames": ["a.example"]}]

    await eventually(recovered)
    async with client.get(f"{webhook.url}/healthz") as r:
        assert (await r.json())["rules_error"] is None


async def served_certificate(webhook, ctx: ssl.SSLContext) -> x509.Certificate:
    host, port = webhook.settings.listen_addr
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="127.0.0.1")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_handshake_verifies_against_the_ca_and_fails_against_another(webhook, tls):
    cert = await served_certificate(webhook, tls.client_context())
    assert cert.issuer == x509.load_pem_x509_certificate(tls.ca.cert_pem.bytes()).subject
    stranger = trustme.CA()
    with pytest.raises(ssl.SSLCertVerificationError):
        await served_certificate(webhook, tls.client_context(stranger))


async def test_a_renewed_certificate_is_served_without_a_restart(webhook, tls):
    before = await served_certificate(webhook, tls.client_context())
    new_ca = trustme.CA()
    leaf = tls.issue(new_ca)
    expected = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())
    assert expected.serial_number != before.serial_number

    async def rotated():
        try:
            return (await served_certificate(webhook, tls.client_context(new_ca))).serial_number \
                == expected.serial_number
        except ssl.SSLError:
            return False

    await eventually(rotated)
    with pytest.raises(ssl.SSLCertVerificationError):
        await served_certificate(webhook, tls.client_context())
    # Reviews keep working over the new certificate.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context(new_ca))) as c:
        async with c.get(f"{webhook.url}/healthz") as r:
            assert r.status == 200


async def test_a_half_written_pair_is_not_adopted(webhook, tls):
    before = await served_certificate(webhook, tls.client_context())
    tls.key.write_bytes(trustme.CA().issue_cert("127.0.0.1").private_key_pem.bytes())  # key of another cert
    with capture_logs() as logs:
        async def failed():
            return any(e["event"] == "tls_reload_failed" for e in logs)

        await eventually(failed)
    assert (await served_certificate(webhook, tls.client_context())).serial_number == before.serial_number


class SwapOnLoad(ssl.SSLContext):
    """A server context that runs `before_load` once, just before its next load_cert_chain reads the files."""

    before_load = None

    def load_cert_chain(self, *args, **kwargs):
        if self.before_load is not None:
            hook, self.before_load = self.before_load, None
            hook()
        return super().load_cert_chain(*args, **kwargs)


async def test_a_pair_swapped_while_it_is_installed_never_mixes_old_and_new(tls, rules_file):
    """The live context loads the bytes that were checked, not the files again.

    A pair that changes on disk between the check and the live load (here:
    the certificate replaced, the key not yet) would otherwise install the
    new certificate with the old key, and every handshake would fail.
    """
    settings = WebhookSettings(listen=f"127.0.0.1:{free_port()}", tls_cert=tls.cert, tls_key=tls.key,
                               rules=rules_file, cache_ip="10.96.0.10", tls_reload_interval=3600)
    hook = build_webhook(settings)
    live = SwapOnLoad(ssl.PROTOCOL_TLS_SERVER)
    live.load_cert_chain(tls.cert, tls.key)
    hook.cert.context = live
    runner = await start(hook)
    try:
        renewed = x509.load_pem_x509_certificate(tls.issue().cert_chain_pems[0].bytes())
        half_written = tls.ca.issue_cert("127.0.0.1")
        live.before_load = lambda: half_written.cert_chain_pems[0].write_to_path(str(tls.cert))
        assert hook.cert.refresh() is True
        assert (await served_certificate(hook, tls.client_context())).serial_number == renewed.serial_number
        with capture_logs() as logs:
            assert hook.cert.refresh() is False  # the half-written pair now on disk is refused
        assert [e["event"] for e in logs] == ["tls_reload_failed"]
        assert (await served_certificate(hook, tls.client_context())).serial_number == renewed.serial_number
    finally:
        await runner.cleanup()


async def test_a_configmap_volume_update_by_symlink_swap_is_picked_up(tls, tmp_path, client):
    """kubelet updates a ConfigMap volume by pointing `..data` at a new folder; the file's own path stays."""
    volume = tmp_path / "volume"
    (volume / "..2026_11_22_v1").mkdir(parents=True)
    (volume / "..2026_11_22_v1" / "config").write_text(RULES)
    (volume / "..data").symlink_to("..2026_11_22_v1")
    (volume / "config").symlink_to("..data/config")
    settings = WebhookSettings(listen=f"127.0.0.1:{free_port()}", tls_cert=tls.cert, tls_key=tls.key,
                               rules=volume / "config", cache_ip="10.96.0.10", rules_reload_interval=0.05)
    hook = build_webhook(settings)
    runner = await start(hook)
    hook.url = f"https://127.0.0.1:{settings.listen_addr[1]}"
    try:
        assert (await aliases(client, hook))[0]["ip"] == "10.106.122.174"
        (volume / "..2026_11_22_v2").mkdir()
        (volume / "..2026_11_22_v2" / "config").write_text(RULES.replace("10.106.122.174", "10.7.7.7"))
        (volume / "..data_tmp").symlink_to("..2026_11_22_v2")
        (volume / "..data_tmp").rename(volume / "..data")  # atomic, as kubelet does

        async def swapped():
            return (await aliases(client, hook))[0]["ip"] == "10.7.7.7"

        await eventually(swapped)
    finally:
        await runner.cleanup()
