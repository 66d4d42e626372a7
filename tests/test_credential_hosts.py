"""Keys and tokens go only to Azure's own hosts and loopback (issue 26, points 5 and 7): tried against a real
listening socket on this machine's non-loopback address, which must see no connection unless allowed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobsync.backends.azure.auth import is_trusted_host
from blobsync.backends.azure.location import parse_location
from blobsync.config import TransferConfig
from blobsync.errors import UsageError
from support.cli import run
from support.recorder import outside_address

KEY = "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleS1rZXk="


class Listener:
    """A TCP socket that counts the connections made to it (and closes each)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def outside() -> Iterator[tuple[str, Listener]]:
    host = outside_address()
    if host is None:
        pytest.skip("this machine has no non-loopback address")
    listener = Listener(host)
    try:
        yield host, listener
    finally:
        listener.close()


def _cp(tmp_path: Path, url: str, env: dict[str, str], *extra: str) -> tuple[int, str]:
    (tmp_path / "f").write_bytes(b"x")
    done = run(["cp", str(tmp_path / "f"), url, "--journal", str(tmp_path / "j.db"), "--max-retries", "0", *extra],
               env={**env, "XDG_STATE_HOME": str(tmp_path)}, timeout=60)
    return done.returncode, done.stderr


@pytest.mark.parametrize("env", [
    {"AZURE_STORAGE_KEY": KEY},
    {"AZURE_STORAGE_CONNECTION_STRING": f"AccountName=acct;AccountKey={KEY}"},
    {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;SharedAccessSignature=sv=2022-11-02&sig=abc"},
    {},  # Azure AD (DefaultAzureCredential): its token is for every account the identity reaches
])
def test_keys_and_tokens_never_reach_an_unknown_host(
        tmp_path: Path, outside: tuple[str, Listener], env: dict[str, str]) -> None:
    host, listener = outside
    code, err = _cp(tmp_path, f"https://{host}:{listener.port}/acct/cont", env)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not an Azure Storage host" in lines[0], err
    assert f"--trusted-microsoft-suffixes '{host}'" in lines[0]
    assert KEY not in err and "sig=abc" not in err
    assert listener.accepted == 0


def test_a_host_the_user_trusts_and_a_sas_in_the_url_are_sent(tmp_path: Path, outside: tuple[str, Listener]) -> None:
    host, listener = outside
    code, err = _cp(tmp_path, f"https://{host}:{listener.port}/acct/cont", {"AZURE_STORAGE_KEY": KEY},
                    "--trusted-microsoft-suffixes", host)
    assert code != 2 and listener.accepted >= 1, err  # allowed: it connected (the listener is no storage)
    before = listener.accepted
    code, err = _cp(tmp_path, f"https://{host}:{listener.port}/acct/cont?sv=2022-11-02&sig=abc", {})
    assert code != 2 and listener.accepted > before, err
    assert "sig=abc" not in err


def test_the_trusted_suffixes() -> None:
    assert is_trusted_host("acct.blob.core.windows.net")
    assert is_trusted_host("acct.blob.core.chinacloudapi.cn")
    assert is_trusted_host("acct.z1.blob.storage.azure.net")
    assert not is_trusted_host("core.windows.net.evil.example")
    assert not is_trusted_host("evilcore.windows.net")
    assert is_trusted_host("acct.blob.example.org", ("*.example.org",))
    assert is_trusted_host("10.1.2.3", ("10.1.2.3",))


def test_ipv6_loopback_without_a_port_is_loopback() -> None:
    assert parse_location("http://[::1]/devstoreaccount1/cont").is_loopback
    assert parse_location("http://[::1]:10000/devstoreaccount1/cont").is_loopback
    assert not parse_location("http://[2001:db8::1]/devstoreaccount1/cont").is_loopback


@pytest.mark.parametrize("url", ["https://user:s3cretpassw0rd@acct.blob.core.windows.net",
                                 "ftp://user:s3cretpassw0rd@x/y",
                                 "https://user:s3cretpassw0rd@acct.blob.core.windows.net/Bad_Name/x"])
def test_a_password_in_a_url_is_never_echoed(tmp_path: Path, url: str) -> None:
    code, err = _cp(tmp_path, url, {})
    assert code == 2 and "s3cretpassw0rd" not in err and "REDACTED" in err, err


@pytest.mark.parametrize("suffix", ["2", "0.2", "*.0.2", "*.10.79.0.2", "com", "*.net", "a b", "host:443"])
def test_a_suffix_that_would_match_inside_an_ip_or_a_whole_tld_is_refused(
        tmp_path: Path, outside: tuple[str, Listener], suffix: str) -> None:
    """Issue 51: '2' trusted 10.79.0.2 (the key went there). Suffixes match names on a label boundary, an IP
    address only named whole; a bare top-level domain is refused: one line, exit 2, nothing sent."""
    host, listener = outside
    code, err = _cp(tmp_path, f"https://{host}:{listener.port}/acct/cont", {"AZURE_STORAGE_KEY": KEY},
                    "--trusted-microsoft-suffixes", suffix)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "--trusted-microsoft-suffixes" in lines[0], err
    assert listener.accepted == 0 and KEY not in err
    with pytest.raises(UsageError, match="trusted-microsoft-suffixes"):
        TransferConfig(trusted_suffixes=(suffix,))


def test_an_ip_address_is_trusted_only_when_named_whole() -> None:
    assert not is_trusted_host("10.79.0.2", ("0.2",)) and not is_trusted_host("10.79.0.2", ("79.0.2",))
    assert is_trusted_host("10.79.0.2", TransferConfig(trusted_suffixes=("10.79.0.2",)).trusted_suffixes)
    assert is_trusted_host("[2001:db8::1]", TransferConfig(trusted_suffixes=("[2001:DB8:0::1]",)).trusted_suffixes)
    assert not is_trusted_host("evil.example.org.attacker.net", ("example.org",))
