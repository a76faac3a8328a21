"""`nezha ca init --local DIR`: the CA for HTTPS dataset hosts, made once and never silently replaced."""

from __future__ import annotations

import pytest
from cryptography import x509

from testkit.kubeapi.fixtures import kube, kube_api, kube_target, ns  # noqa: F401  (fixtures)
from tests.integration.cli.test_bad_input import nezha, one_line


def test_the_ca_is_created_once_with_a_private_key_and_kept_on_later_runs(tmp_path):
    folder = tmp_path / "ca"
    run = nezha("ca", "init", "--local", str(folder))
    assert run.returncode == 0 and run.stdout.startswith("created "), run.stderr
    cert = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert (folder / "ca.key").stat().st_mode & 0o777 == 0o600
    before = (folder / "ca.crt").read_bytes(), (folder / "ca.key").read_bytes()
    again = nezha("ca", "init", "--local", str(folder))
    assert again.returncode == 0 and again.stdout.startswith("kept ")
    assert ((folder / "ca.crt").read_bytes(), (folder / "ca.key").read_bytes()) == before


def test_half_a_ca_or_a_broken_one_is_refused_and_left_as_it_is(tmp_path):
    folder = tmp_path / "ca"
    nezha("ca", "init", "--local", str(folder))
    key = (folder / "ca.key").read_bytes()
    (folder / "ca.crt").unlink()
    one_line(nezha("ca", "init", "--local", str(folder)), 1, "ca.key exists but", "ca.crt does not")
    assert (folder / "ca.key").read_bytes() == key and not (folder / "ca.crt").exists()
    (folder / "ca.crt").write_text("garbage")
    one_line(nezha("ca", "init", "--local", str(folder)), 1, "cannot read the CA")
    assert (folder / "ca.crt").read_text() == "garbage"


def test_a_folder_that_cannot_be_written_is_one_line_and_the_flag_is_required(tmp_path):
    one_line(nezha("ca", "init", "--local", "/proc/nezha-ca"), 1, "cannot write the CA to /proc/nezha-ca")
    run = nezha("ca", "init")
    assert run.returncode == 2 and "--local" in run.stderr


# -- in a cluster (the API double) -------------------------------------------------------

async def _read(kube, ns):
    from kubernetes_asyncio import client

    core = client.CoreV1Api(kube)
    return await core.read_namespaced_secret("nezha-ca-key", ns), await core.read_namespaced_config_map("nezha-ca", ns)


async def test_in_a_cluster_the_key_goes_to_a_secret_and_the_certificate_with_a_full_bundle_to_a_configmap(
        kube, kube_api, ns):
    import base64

    from nezha.ca_cli import init_in_cluster, system_roots
    from nezha.pki import Pair

    line = await init_in_cluster(kube, ns)
    assert "created the CA in Secret nezha-ca-key" in line and "ConfigMap nezha-ca" in line
    secret, configmap = await _read(kube, ns)
    pair = Pair.load(base64.b64decode(secret.data["ca.crt"]), base64.b64decode(secret.data["ca.key"]))
    assert configmap.data["ca.crt"] == pair.cert_pem.decode()
    bundle = configmap.data["ca-bundle.crt"].encode()
    assert bundle.startswith(system_roots()) and bundle.endswith(pair.cert_pem)  # public roots, then ours
    assert "ca.key" not in configmap.data and "PRIVATE KEY" not in configmap.data["ca-bundle.crt"]


async def test_in_a_cluster_a_second_run_writes_nothing_and_half_a_ca_is_refused(kube, kube_api, ns):
    from kubernetes_asyncio import client

    from nezha.ca_cli import init_in_cluster
    from nezha.errors import RunError

    await init_in_cluster(kube, ns)
    before = [o.metadata.resource_version for o in await _read(kube, ns)]
    assert "nothing to do" in await init_in_cluster(kube, ns)
    assert [o.metadata.resource_version for o in await _read(kube, ns)] == before
    await client.CoreV1Api(kube).delete_namespaced_secret("nezha-ca-key", ns)
    with pytest.raises(RunError, match="whose key Secret nezha-ca-key is gone"):
        await init_in_cluster(kube, ns)


async def _nezha_async(*args: str) -> tuple[int, str, str]:
    """The command as a process, without blocking the loop the API double answers on."""
    import asyncio
    import sys

    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "nezha", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_the_cluster_form_runs_against_a_kubeconfig(kube, kube_api, ns, tmp_path):
    from testkit.kubeapi.kubeconfig import kubeconfig

    config = str(kubeconfig(tmp_path / "kubeconfig", kube_api.url))
    code, out, err = await _nezha_async("ca", "init", "--namespace", ns, "--kubeconfig", config)
    assert code == 0 and "created the CA" in out, err
    code, out, err = await _nezha_async("ca", "init", "--namespace", ns, "--kubeconfig", config)
    assert code == 0 and "nothing to do" in out, err
    code, out, err = await _nezha_async("ca", "init", "--namespace", ns, "--local", str(tmp_path / "x"))
    assert code == 2 and "not allowed with" in err
