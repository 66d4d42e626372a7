"""HTTPS end to end (real Azure is HTTPS only): Azurite serving TLS with a self-signed certificate that the
blobsync process trusts through SSL_CERT_FILE. Every kind of request (block bodies sent in slices, small bodies in
one write, ranged GETs into the block buffers, listings) must verify the certificate and move the bytes intact."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from blobsync.config import MiB
from support.azurite import Azurite
from support.cli import random_file, run


def _self_signed(folder: Path, *dns_names: str) -> tuple[Path, Path]:
    """A certificate (its own CA) for 127.0.0.1 and `dns_names`, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        *(x509.DNSName(n) for n in dns_names)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Azurite, Path]]:
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    with Azurite(tls=(cert, key)) as instance:
        yield instance, cert


def test_upload_download_sync_and_ls_over_https(tls_azurite: tuple[Azurite, Path], tmp_path: Path) -> None:
    azurite, cert = tls_azurite
    service = BlobServiceClient.from_connection_string(azurite.connection_string, connection_verify=str(cert))
    client = service.create_container("tls")
    trust = {"SSL_CERT_FILE": str(cert)}
    url = f"{azurite.blob_endpoint}/tls"
    src = tmp_path / "src"
    big = random_file(src / "big.bin", 5 * MiB + 3, seed=1)  # 1 MiB blocks: bodies sent in slices
    small = random_file(src / "small.bin", 1000, seed=2)  # one Put Blob: the lean client
    journal = ["--journal", str(tmp_path / "j.db"), "--block-size-mb", "1", "--quiet"]

    up = run(["sync", str(src), url, *journal], env=trust)
    assert up.returncode == 0, up.stderr
    assert client.download_blob("big.bin").readall() == big
    assert client.download_blob("small.bin").readall() == small

    down = run(["cp", "-r", "--as-subdir=false", url, str(tmp_path / "back"), *journal], env=trust)
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "back" / "big.bin").read_bytes() == big
    assert (tmp_path / "back" / "small.bin").read_bytes() == small
    listed = run(["ls", url], env=trust)
    assert listed.returncode == 0 and "2 blob(s)" in listed.stdout


def test_an_untrusted_certificate_is_one_clear_error(tls_azurite: tuple[Azurite, Path], tmp_path: Path) -> None:
    azurite, _ = tls_azurite
    (tmp_path / "f").write_bytes(b"x")
    for args in (["cp", str(tmp_path / "f"), f"{azurite.blob_endpoint}/tls", "--max-retries", "0"],
                 ["ls", f"{azurite.blob_endpoint}/tls", "--max-retries", "0"]):
        done = run([*args, *(["--journal", str(tmp_path / "j.db")] if args[0] == "cp" else [])])
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and "CERTIFICATE_VERIFY_FAILED" in done.stderr


def test_an_untrusted_certificate_fails_at_once_not_after_every_retry(tls_azurite: tuple[Azurite, Path],
                                                                      tmp_path: Path) -> None:
    import time

    azurite, _ = tls_azurite
    (tmp_path / "f").write_bytes(b"x")
    started = time.monotonic()
    done = run(["cp", str(tmp_path / "f"), f"{azurite.blob_endpoint}/tls", "--journal", str(tmp_path / "j.db")])
    assert time.monotonic() - started < 10  # 9 tries with backoff took 25-32 s
    assert done.returncode == 1 and "Traceback" not in done.stderr
    line = next(line for line in done.stderr.splitlines() if line.startswith("blobsync: error:"))
    assert "127.0.0.1" in line and "not trusted" in line and "SSL_CERT_FILE" in line, line
