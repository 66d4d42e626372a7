"""`blobsync doctor`, `ls` and `rm` against Azurite, plus the offline SAS reading doctor relies on."""

from __future__ import annotations

import asyncio
import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import pytest
from azure.storage.blob import ContainerSasPermissions, StandardBlobTier, generate_container_sas

import blobsync
from blobsync.backends.azure.doctor import read_sas
from blobsync.backends.azure.location import parse_location
from blobsync.backends.diagnosis import Diagnosis, Level
from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import run


def _sas(azurite: Azurite, container: str, permission: str, expiry: datetime, **kw: object) -> str:
    return generate_container_sas(azurite.account, container, account_key=azurite.key,
                                  permission=ContainerSasPermissions.from_string(permission), expiry=expiry, **kw)


def _in_an_hour() -> datetime:
    return datetime.now(UTC) + timedelta(hours=5)


def _no_secret(sas: str, *texts: str) -> None:
    raw = sas.split("sig=")[1].split("&")[0]
    for text in texts:
        assert raw not in text and unquote(raw) not in text


def test_doctor_read_only_sas_names_the_missing_write(azurite: Azurite, container: ContainerHandle) -> None:
    sas = _sas(azurite, container.name, "rl", _in_an_hour())
    done = run(["doctor", f"{container.url}?{sas}"])
    assert done.returncode == 0, done.stdout + done.stderr  # nothing is wrong with it for reading
    out = done.stdout
    assert "read, list (sp=rl)" in out
    upload_line = next(line for line in out.splitlines() if line.strip().startswith("upload (cp)"))
    assert "'w' (write)" in upload_line
    assert "sync up --delete-destination" in out and "'d' (delete)" in out
    assert "exists" in out and "answered" in out
    _no_secret(sas, done.stdout, done.stderr)


def test_doctor_expired_sas_says_expired_and_exits_3(azurite: Azurite, container: ContainerHandle) -> None:
    sas = _sas(azurite, container.name, "racwdl", datetime.now(UTC) - timedelta(hours=2))
    done = run(["doctor", f"{container.url}?{sas}"])
    assert done.returncode == 3
    assert "FAIL" in done.stdout and "expired" in done.stdout and "generate a new one" in done.stdout
    assert "Traceback" not in done.stderr
    _no_secret(sas, done.stdout, done.stderr)


def test_doctor_write_test_puts_and_deletes_a_probe(azurite: Azurite, container: ContainerHandle) -> None:
    sas = _sas(azurite, container.name, "racwdl", _in_an_hour())
    done = run(["doctor", f"{container.url}/some/dir?{sas}", "--write-test", "--output-type", "json"])
    assert done.returncode == 0, done.stdout
    record = json.loads(done.stdout)
    topics = {f["topic"]: f["level"] for f in record["findings"]}
    assert topics["write test"] == "ok" and topics["delete test"] == "ok"
    assert record["missing"] == {}
    assert container.blob_names() == []  # the probe is gone
    _no_secret(sas, done.stdout, done.stderr)


def test_doctor_write_test_with_read_only_sas_fails_as_auth(azurite: Azurite, container: ContainerHandle) -> None:
    sas = _sas(azurite, container.name, "rl", _in_an_hour())
    done = run(["doctor", f"{container.url}?{sas}", "--write-test"])
    assert done.returncode == 3
    line = next(line for line in done.stdout.splitlines() if "write test" in line)
    assert "FAIL" in line and "'w'" in line


def test_doctor_missing_container_and_dead_endpoint(azurite: Azurite, azurite_env: str) -> None:
    done = run(["doctor", f"{azurite.blob_endpoint}/no-such-container"], env={"AZURE_STORAGE_CONNECTION_STRING":
                                                                            azurite_env})
    assert done.returncode == 1
    assert "does not exist" in done.stdout and "--create-container" in done.stdout
    assert azurite.key not in done.stdout + done.stderr  # the key from the connection string is never printed
    assert "connection string" in done.stdout.lower() or "key" in done.stdout

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    dead = run(["doctor", f"http://127.0.0.1:{port}/devstoreaccount1/cont", "--timeout", "3"])
    assert dead.returncode == 1
    assert "does not answer" in dead.stdout and "Traceback" not in dead.stderr


def test_doctor_goes_by_the_url_s_backend_and_a_store_without_credentials_says_so() -> None:
    """The registry hands doctor to the backend the scheme selects: memory:// and s3:// have no SAS or endpoint
    of Azure's to check, and say so in a line (exit 2), the library's call too."""
    for url in ("memory://box/x", "s3://bucket/x"):
        done = run(["doctor", url])
        assert done.returncode == 2, done.stderr
        assert "doctor checks Azure Blob URLs" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(blobsync.UsageError, match="doctor checks Azure Blob URLs"):
        blobsync.diagnose("memory://box")
    with pytest.raises(blobsync.UsageError, match="timeout=-1 is out of range"):
        asyncio.run(blobsync.aio.diagnose("memory://box", timeout=-1))  # the async call checks its arguments too


def test_read_sas_catches_the_usual_mistakes() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def diagnose(query: str, scheme: str = "https") -> Diagnosis:
        d = Diagnosis("x", "sas")
        read_sas(parse_location(f"{scheme}://acct.blob.core.windows.net/cont?{query}&sig=abc"), d, now)
        return d

    def failed(d: Diagnosis) -> dict[str, str]:
        return {f.topic: f.text for f in d.findings if f.level is Level.FAIL}

    later = "se=2026-12-30T00:00:00Z"
    assert failed(diagnose(f"sp=rl&st=2026-12-01T00:00:00Z&{later}"))["start"].startswith("the SAS is not valid")
    assert "HTTPS only" in failed(diagnose(f"sp=rl&spr=https&{later}", scheme="http"))["protocol"]
    soon = diagnose("sp=rwl&se=2026-11-30T12:30:00Z")
    assert any(f.level is Level.WARN and "expires in 30 minutes" in f.text for f in soon.findings)
    create_only = diagnose(f"sp=c&{later}")
    assert "'w' (write)" in create_only.missing["upload (cp)"]
    blob_sas = diagnose(f"sp=rw&sr=b&{later}")
    assert "sr=c" in blob_sas.missing["sync down"]
    account = diagnose(f"sp=rwl&ss=q&srt=s&{later}")
    assert set(failed(account)) == {"services", "resource types"}
    assert account.exit_code == 3
    assert diagnose(f"sp=racwdl&{later}").missing == {}
    assert "user delegation" in diagnose(f"sp=r&skoid=x&{later}").findings[0].text


def test_ls_lists_names_sizes_tiers_and_md5(container: ContainerHandle, azurite_env: str) -> None:
    container.client.upload_blob("a/one.txt", b"1" * 10)
    container.client.upload_blob("a/two.txt", b"2" * 20, standard_blob_tier=StandardBlobTier.COOL)
    container.client.upload_blob("ab.txt", b"x")
    text = run(["ls", container.url + "/a"])
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert [line.split()[-1] for line in lines[:-1]] == ["one.txt", "two.txt"]  # relative to the URL, as AzCopy
    assert "Cool" in lines[1] and lines[-1].startswith("2 blob(s)")
    as_json = run(["ls", container.url, "--output-type", "json"])
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    blobs = {r["name"]: r for r in records if r["type"] == "blob"}
    assert set(blobs) == {"a/one.txt", "a/two.txt", "ab.txt"}
    assert blobs["a/two.txt"]["size"] == 20 and blobs["a/two.txt"]["tier"] == "Cool"
    assert blobs["a/one.txt"]["content_md5"]  # the SDK stored one
    assert records[-1] == {"type": "summary", "blobs": 3, "bytes": 31}


def test_rm_one_recursive_filtered_and_dry_run(container: ContainerHandle, azurite_env: str) -> None:
    for name in ("logs/a.log", "logs/b.log", "logs/keep.txt", "logs/sub/c.log", "other.log"):
        container.client.upload_blob(name, name.encode())
    not_recursive = run(["rm", container.url + "/logs"])
    assert not_recursive.returncode == 2 and "-r" in not_recursive.stderr
    dry = run(["rm", "-r", container.url + "/logs", "--include-pattern", "*.log", "--dry-run"])
    assert dry.returncode == 0 and dry.stdout.count("would remove") == 3
    assert len(container.blob_names()) == 5
    done = run(["rm", "-r", container.url + "/logs", "--include-pattern", "*.log", "--exclude-path", "sub",
                "--output-type", "json"])
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["path"] for r in records if r["type"] == "file") == ["a.log", "b.log"]
    assert container.blob_names() == ["logs/keep.txt", "logs/sub/c.log", "other.log"]
    single = run(["rm", container.url + "/other.log"])
    assert single.returncode == 0 and "Removed 1 blob(s)" in single.stdout
    missing = run(["rm", container.url + "/other.log"])
    assert missing.returncode == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr


def test_rm_without_delete_permission_stops_with_the_auth_error(azurite: Azurite, container: ContainerHandle) -> None:
    container.client.upload_blob("x/a", b"a")
    container.client.upload_blob("x/b", b"b")
    sas = _sas(azurite, container.name, "rl", _in_an_hour())
    done = run(["rm", "-r", f"{container.url}/x?{sas}"])
    assert done.returncode == 3
    assert "'d' (delete)" in done.stderr
    assert container.blob_names() == ["x/a", "x/b"]
    _no_secret(sas, done.stdout, done.stderr)


def test_rm_list_of_files(container: ContainerHandle, azurite_env: str, tmp_path: Path) -> None:
    for name in ("d/a.bin", "d/b.bin", "d/c.bin", "d/sub/e.bin"):
        container.client.upload_blob(name, name.encode())
    listing = tmp_path / "list.txt"
    listing.write_text("# old runs\na.bin\n\nsub/e.bin\nmissing.bin\n")
    done = run(["rm", container.url + "/d", "--list-of-files", str(listing), "--output-type", "json"])
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    by_path = {r["path"]: r["status"] for r in records if r["type"] == "file"}
    assert by_path == {"a.bin": "deleted", "sub/e.bin": "deleted", "missing.bin": "skipped"}
    assert container.blob_names() == ["d/b.bin", "d/c.bin"]
