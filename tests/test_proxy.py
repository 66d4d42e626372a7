"""Through a proxy, as most companies and many VNets require: HTTPS Azurite behind a CONNECT proxy with Basic auth."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from blobsync.config import MiB
from support.azurite import Azurite, free_port
from support.cli import random_file, run
from support.connect_proxy import ConnectProxy
from test_tls import _self_signed


@pytest.fixture(scope="module")
def https_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Azurite, Path]]:
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    with Azurite(tls=(cert, key)) as instance:
        # Every test of this module writes into it, whichever runs first (pytest-xdist spreads them).
        BlobServiceClient.from_connection_string(instance.connection_string,
                                                 connection_verify=str(cert)).create_container("viaproxy")
        yield instance, cert


@pytest.fixture
def proxy_server() -> Iterator[ConnectProxy]:
    with ConnectProxy("alice", "s3cret-pw") as server:
        yield server


def _env(cert: Path, **extra: str) -> dict[str, str]:
    # Both cases are set the way users do; NO_PROXY empty so 127.0.0.1 goes through the proxy.
    return {"SSL_CERT_FILE": str(cert), "NO_PROXY": "", "no_proxy": "", **extra}


def test_upload_download_sync_and_ls_go_through_the_proxy(https_azurite: tuple[Azurite, Path],
                                                          proxy_server: ConnectProxy, tmp_path: Path) -> None:
    azurite, cert = https_azurite
    service = BlobServiceClient.from_connection_string(azurite.connection_string, connection_verify=str(cert))
    client = service.get_container_client("viaproxy")
    env = _env(cert, HTTPS_PROXY=proxy_server.url)
    url = f"{azurite.blob_endpoint}/viaproxy"
    src = tmp_path / "src"
    big = random_file(src / "big.bin", 3 * MiB + 3, seed=1)
    small = random_file(src / "small.bin", 1000, seed=2)
    common = ["--journal", str(tmp_path / "j.db"), "--block-size-mb", "1", "--quiet"]
    up = run(["sync", str(src), url, *common], env=env)
    assert up.returncode == 0, up.stderr
    assert proxy_server.tunnels > 0
    assert client.download_blob("big.bin").readall() == big and client.download_blob("small.bin").readall() == small
    down = run(["cp", "-r", "--as-subdir=false", url, str(tmp_path / "back"), *common], env=env)
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "back" / "big.bin").read_bytes() == big
    tunnels = proxy_server.tunnels
    listed = run(["ls", url], env={**_env(cert), "https_proxy": proxy_server.url})  # lower case works too
    assert listed.returncode == 0 and "2 blob(s)" in listed.stdout, listed.stderr
    assert proxy_server.tunnels > tunnels


def test_wrong_proxy_credentials_are_an_auth_error_naming_the_proxy(https_azurite: tuple[Azurite, Path],
                                                                   proxy_server: ConnectProxy,
                                                                   tmp_path: Path) -> None:
    azurite, cert = https_azurite
    random_file(tmp_path / "f.bin", 10)
    done = run(["cp", str(tmp_path / "f.bin"), f"{azurite.blob_endpoint}/viaproxy/f.bin", "--journal",
                str(tmp_path / "j.db")], env=_env(cert, HTTPS_PROXY=proxy_server.url_with("alice", "wrong-pw")))
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "407" in done.stderr and f"127.0.0.1:{proxy_server.port}" in done.stderr
    assert "wrong-pw" not in done.stderr + done.stdout
    assert proxy_server.refused >= 1 and proxy_server.tunnels == 0


def test_no_proxy_bypasses_the_proxy(https_azurite: tuple[Azurite, Path], proxy_server: ConnectProxy,
                                     tmp_path: Path) -> None:
    azurite, cert = https_azurite
    random_file(tmp_path / "f.bin", 10)
    done = run(["cp", str(tmp_path / "f.bin"), f"{azurite.blob_endpoint}/viaproxy/bypass.bin", "--journal",
                str(tmp_path / "j.db")],
               env={**_env(cert, HTTPS_PROXY=proxy_server.url), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    assert done.returncode == 0, done.stderr
    assert proxy_server.tunnels == 0


def test_an_unreachable_proxy_is_a_clear_line_soon(https_azurite: tuple[Azurite, Path], tmp_path: Path) -> None:
    azurite, cert = https_azurite
    random_file(tmp_path / "f.bin", 10)
    started = time.monotonic()
    done = run(["cp", str(tmp_path / "f.bin"), f"{azurite.blob_endpoint}/viaproxy/f.bin", "--journal",
                str(tmp_path / "j.db"), "--max-retries", "1"],
               env=_env(cert, HTTPS_PROXY=f"http://127.0.0.1:{free_port()}"))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "cannot reach" in done.stderr and "proxy" in done.stderr
    assert time.monotonic() - started < 30


def test_the_proxy_flag_overrides_the_environment_and_doctor_names_it(https_azurite: tuple[Azurite, Path],
                                                                      proxy_server: ConnectProxy,
                                                                      tmp_path: Path) -> None:
    azurite, cert = https_azurite
    data = random_file(tmp_path / "f.bin", 10)
    unreachable = f"http://127.0.0.1:{free_port()}"
    url = f"{azurite.blob_endpoint}/viaproxy/flag.bin"
    done = run(["cp", str(tmp_path / "f.bin"), url, "--journal", str(tmp_path / "j.db"), "--proxy",
                proxy_server.url], env=_env(cert, HTTPS_PROXY=unreachable))
    assert done.returncode == 0, done.stderr
    assert proxy_server.tunnels > 0
    service = BlobServiceClient.from_connection_string(azurite.connection_string, connection_verify=str(cert))
    assert service.get_blob_client("viaproxy", "flag.bin").download_blob().readall() == data
    doctor = run(["doctor", f"{azurite.blob_endpoint}/viaproxy", "--proxy", proxy_server.url], env=_env(cert))
    assert f"127.0.0.1:{proxy_server.port} (from --proxy)" in doctor.stdout, doctor.stdout
    assert "s3cret-pw" not in doctor.stdout + doctor.stderr
    assert doctor.returncode == 0, doctor.stdout
    from_env = run(["doctor", f"{azurite.blob_endpoint}/viaproxy"], env=_env(cert, HTTPS_PROXY=proxy_server.url))
    assert "(from HTTPS_PROXY)" in from_env.stdout and "s3cret-pw" not in from_env.stdout, from_env.stdout


def test_a_bad_proxy_flag_is_a_usage_error(tmp_path: Path) -> None:
    done = run(["ls", "http://127.0.0.1:1/devstoreaccount1/cont", "--proxy", "socks5://host:1080"])
    assert done.returncode == 2 and "--proxy" in done.stderr and "Traceback" not in done.stderr


def test_the_proxy_password_reaches_no_output_log_or_journal(https_azurite: tuple[Azurite, Path],
                                                             proxy_server: ConnectProxy, tmp_path: Path) -> None:
    azurite, cert = https_azurite
    random_file(tmp_path / "f.bin", 10)
    journal = tmp_path / "j.db"
    for env, extra in ((_env(cert, HTTPS_PROXY=proxy_server.url), []), (_env(cert), ["--proxy", proxy_server.url])):
        done = run(["cp", str(tmp_path / "f.bin"), f"{azurite.blob_endpoint}/viaproxy/secret.bin", "--journal",
                    str(journal), "--log-level", "DEBUG", "--output-type", "json", *extra], env=env)
        assert done.returncode == 0, done.stderr
        assert "s3cret-pw" not in done.stdout + done.stderr
    bad = run(["ls", f"{azurite.blob_endpoint}/viaproxy", "--proxy", "http://alice:s3cret-pw@127.0.0.1:1/\n"])
    assert bad.returncode == 2 and "s3cret-pw" not in bad.stdout + bad.stderr
    assert b"s3cret-pw" not in journal.read_bytes()


def test_a_client_calls_own_proxy_is_the_one_its_requests_take(https_azurite: tuple[Azurite, Path],
                                                              proxy_server: ConnectProxy, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting of the session (how requests go out) given on one call of a Client is honoured for that call
    (it runs on a session of its own), and the Client's other calls keep the Client's."""
    import blobsync

    azurite, cert = https_azurite
    data = random_file(tmp_path / "f.bin", 2000)
    for name, value in _env(cert).items():  # the TLS trust comes from the process's environment
        monkeypatch.setenv(name, value)
    env = {**_env(cert), "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    url = f"{azurite.blob_endpoint}/viaproxy"
    journal = tmp_path / "j.db"
    with blobsync.Client(url, blobsync.TransferConfig(journal_path=journal), env=env) as client:
        client.copy(tmp_path / "f.bin", f"{url}/direct.bin", raise_on_error=True)
        assert proxy_server.tunnels == 0
        client.copy(tmp_path / "f.bin", f"{url}/proxied.bin",
                    blobsync.TransferConfig(journal_path=journal, proxy=proxy_server.url), raise_on_error=True)
        assert proxy_server.tunnels > 0
        tunnels = proxy_server.tunnels
        client.copy(tmp_path / "f.bin", f"{url}/direct2.bin", raise_on_error=True)
        assert proxy_server.tunnels == tunnels
    service = BlobServiceClient.from_connection_string(azurite.connection_string, connection_verify=str(cert))
    assert service.get_blob_client("viaproxy", "proxied.bin").download_blob().readall() == data
