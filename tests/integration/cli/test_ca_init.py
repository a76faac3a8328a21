"""`nezha ca init --local DIR`: the CA for HTTPS dataset hosts, made once and never silently replaced."""

from __future__ import annotations

from cryptography import x509

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
