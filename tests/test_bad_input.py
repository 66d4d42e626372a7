"""Bad input gets one clear line, an exit code a script can act on, no traceback, and loses nothing."""

from __future__ import annotations

import base64
import os
import signal
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import pytest
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

from blobsync.config import MiB
from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import kill_when_held, random_file, run, start
from support.proxy import FaultProxy


def _sas(azurite: Azurite, container: str, permission: str, expiry: datetime) -> str:
    return generate_container_sas(
        azurite.account, container, account_key=azurite.key,
        permission=ContainerSasPermissions.from_string(permission), expiry=expiry,
    )


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("blobsync: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["cp", "/nonexistent/file.bin", "http://127.0.0.1:1/devstoreaccount1/cont"], "does not exist"),
        (["cp", "{tmp}", "http://127.0.0.1:1/devstoreaccount1/cont"], "pass -r/--recursive"),
        (["cp", "{tmp}/f", "https://acct.blob.core.windows.net"], "names no container"),
        (["cp", "{tmp}/f", "ftp://x/y"], "is not a blob URL"),
        (["cp", "{tmp}/f", "http://127.0.0.1:1/devstoreaccount1/Bad_Name"], "invalid container name"),
        (["cp", "{tmp}/f", "http://127.0.0.1:1/devstoreaccount1/cont", "--block-size-mb", "5000"], "out of range"),
        (["cp", "{tmp}/f", "http://127.0.0.1:1/devstoreaccount1/cont", "--metadata", "bad name=1"], "metadata"),
        (["cp", "{tmp}/f", "http://127.0.0.1:1/devstoreaccount1/cont", "--memory-mb", "4",
          "--block-size-mb", "8"], "must hold at least one block"),
        *[(["cp", "{tmp}/f", "http://127.0.0.1:1/devstoreaccount1/cont", flag, value], fragment)
          for flag, value, fragment in [
              ("--cap-mbps", "nan", "0.001 to 1,000,000 Mbit/s"), ("--cap-mbps", "inf", "Mbit/s"),
              ("--cap-mbps", "-1", "Mbit/s"), ("--stall-timeout", "nan", "0.1 to 86,400 seconds"),
              ("--retry-deadline", "inf", "seconds"), ("--block-size-mb", "0.000001", "1 KiB to 4000 MiB"),
              ("--memory-mb", "nan", "1 MiB to 1 TiB"), ("--put-blob-size-mb", "inf", "5000 MiB"),
              ("--max-retries", "1000", "0 to 100")]],
    ],
)
def test_usage_errors_exit_2(args: list[str], fragment: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = run([*args, "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert fragment in _one_error_line(done.stderr)


def test_missing_container_is_named_and_create_container_fixes_it(
    azurite: Azurite, container: ContainerHandle, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "f.bin", 1000)
    url = f"{azurite.blob_endpoint}/{container.name}-missing"
    done = run(["cp", str(tmp_path / "f.bin"), url, "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1
    line = _one_error_line(done.stderr)
    assert f"container '{container.name}-missing' does not exist" in line and "--create-container" in line
    done = run(["cp", str(tmp_path / "f.bin"), url, "--journal", str(tmp_path / "j.db"), "--create-container"])
    assert done.returncode == 0, done.stderr
    other = container.client._get_blob_service_client().get_container_client(f"{container.name}-missing")
    try:
        assert other.download_blob("f.bin").readall() == data
    finally:
        other.delete_container()


def test_read_only_sas_says_write_is_missing(azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    random_file(tmp_path / "f.bin", 1000)
    sas = _sas(azurite, container.name, "rl", datetime.now(UTC) + timedelta(hours=1))
    done = run(["cp", str(tmp_path / "f.bin"), f"{container.url}?{sas}", "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 3
    line = _one_error_line(done.stderr)
    assert "lacks 'w' (write)" in line
    assert container.blob_names() == []


def test_expired_sas_says_expired(azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    random_file(tmp_path / "f.bin", 1000)
    sas = _sas(azurite, container.name, "rwl", datetime.now(UTC) - timedelta(hours=1))
    done = run(["cp", str(tmp_path / "f.bin"), f"{container.url}?{sas}", "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 3
    line = _one_error_line(done.stderr)
    assert "expired" in line
    sig = unquote(sas.split("sig=")[1].split("&")[0])
    assert sig not in line and sas.split("sig=")[1].split("&")[0] not in line


@pytest.mark.parametrize("output_type", ["text", "json"])
def test_no_secret_reaches_output_logs_or_journal(
    azurite: Azurite, container: ContainerHandle, tmp_path: Path, output_type: str
) -> None:
    data = random_file(tmp_path / "src" / "big.bin", 3 * MiB + 5)
    random_file(tmp_path / "src" / "small.txt", 10)
    sas = _sas(azurite, container.name, "racwl", datetime.now(UTC) + timedelta(hours=1))
    journal = tmp_path / "j.db"
    done = run(["cp", "-r", "--as-subdir=false", str(tmp_path / "src"), f"{container.url}/pre?{sas}",
                "--journal", str(journal),
                "--block-size-mb", "1", "--log-level", "DEBUG", "--output-type", output_type,
                "--progress-interval", "0.05"])
    assert done.returncode == 0, done.stderr
    assert "sig=REDACTED" in done.stderr  # DEBUG logs every request's URL: the redaction had work to do
    assert container.download("pre/big.bin") == data
    raw_sig = sas.split("sig=")[1].split("&")[0]
    secrets = {raw_sig, unquote(raw_sig), azurite.key}
    listed = run(["jobs", "list", "--journal", str(journal)])
    shown = run(["jobs", "show", listed.stdout.split()[0], "--journal", str(journal)])
    blobs = b"".join(p.read_bytes() for p in tmp_path.glob("j.db*"))
    for secret in secrets:
        for text in (done.stdout, done.stderr, listed.stdout, shown.stdout):
            assert secret not in text
        assert secret.encode() not in blobs
    with sqlite3.connect(journal) as db:
        (dest,) = db.execute("select dest from jobs").fetchone()
    assert dest == f"{container.url}/pre"


def test_file_vanishing_mid_run_is_reported_and_the_rest_continue(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    big = random_file(src / "a-big.bin", 4 * MiB, seed=1)
    random_file(src / "b-gone.txt", 100, seed=2)
    args = ["cp", "-r", "--as-subdir=false", str(src), f"{proxy.endpoint()}/{container.name}",
            "--journal", str(tmp_path / "j.db"),
            "--block-size-mb", "1", "--concurrency", "1", "--quiet"]
    proxy.hold_after("put_block", 1)  # one worker: b-gone.txt waits until a-big.bin is done
    proc = start(args)
    proxy.wait_for_held(1, timeout=60)
    (src / "b-gone.txt").unlink()
    proxy.clear_rules()
    proxy.release_holds()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "1 uploaded, 0 skipped, 1 failed" in out
    assert "FAILED b-gone.txt" in out and "No such file" in out
    assert "Traceback" not in err
    assert container.blob_names() == ["a-big.bin"]
    assert container.download("a-big.bin") == big


def test_file_changing_during_upload_is_never_committed(
    container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "grow.log"
    random_file(src, 4 * MiB, seed=3)
    args = ["cp", str(src), f"{proxy.endpoint()}/{container.name}/", "--journal", str(tmp_path / "j.db"),
            "--block-size-mb", "1", "--quiet"]
    proxy.hold_after("put_block", 2)
    proc = start(args)
    proxy.wait_for_held(1, timeout=60)
    with src.open("ab") as f:
        f.write(b"appended while uploading")
    proxy.clear_rules()
    proxy.release_holds()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    assert "changed while it was being uploaded" in out
    assert container.blob_names() == []
    # Running again uploads the file as it is now.
    done = run(args)
    assert done.returncode == 0, done.stderr
    assert container.download("grow.log") == src.read_bytes()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_reported_and_the_rest_continue(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    good = random_file(src / "ok.bin", 100)
    random_file(src / "secret.bin", 100)
    (src / "secret.bin").chmod(0)
    done = run(["cp", "-r", "--as-subdir=false", str(src), container.url, "--journal", str(tmp_path / "j.db")])
    assert done.returncode == 1
    assert "FAILED secret.bin" in done.stdout and "Permission denied" in done.stdout
    assert container.download("ok.bin") == good


def test_unreachable_endpoint_fails_with_a_clear_line(tmp_path: Path) -> None:
    random_file(tmp_path / "f.bin", 10)
    from support.azurite import free_port

    url = f"http://127.0.0.1:{free_port()}/devstoreaccount1/cont"
    done = run(["cp", str(tmp_path / "f.bin"), url, "--journal", str(tmp_path / "j.db"), "--max-retries", "1"])
    assert done.returncode == 1
    line = _one_error_line(done.stderr)
    assert "put blob 'f.bin'" in line and "onnect" in line


def test_sigterm_is_an_interrupt(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    random_file(tmp_path / "f.bin", 4 * MiB)
    proxy.hold_after("put_block", 1)
    proc = start(["cp", str(tmp_path / "f.bin"), f"{proxy.endpoint()}/{container.name}/",
                  "--journal", str(tmp_path / "j.db"), "--block-size-mb", "1", "--quiet"])
    proxy.wait_for_held(1, timeout=60)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    proxy.clear_rules()
    proxy.release_holds()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err


def test_wrong_account_key_is_an_auth_error(container: ContainerHandle, tmp_path: Path) -> None:
    random_file(tmp_path / "f.bin", 10)
    wrong = base64.b64encode(b"not the key of this account, 64 bytes long....................").decode()
    done = run(["cp", str(tmp_path / "f.bin"), container.url, "--journal", str(tmp_path / "j.db")],
               env={"AZURE_STORAGE_ACCOUNT": "devstoreaccount1", "AZURE_STORAGE_KEY": wrong})
    assert done.returncode == 3
    line = _one_error_line(done.stderr)
    assert "account key from AZURE_STORAGE_KEY" in line and "devstoreaccount1" in line and wrong not in line
    assert container.blob_names() == []


def test_account_and_key_from_environment_work(azurite: Azurite, container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "f.bin", 10)
    done = run(["cp", str(tmp_path / "f.bin"), container.url, "--journal", str(tmp_path / "j.db")],
               env={"AZURE_STORAGE_ACCOUNT": "devstoreaccount1", "AZURE_STORAGE_KEY": azurite.key})
    assert done.returncode == 0, done.stderr
    assert container.download("f.bin") == data


def test_resumed_job_takes_its_sas_from_the_new_run(
    azurite: Azurite, container: ContainerHandle, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = random_file(tmp_path / "f.bin", 4 * MiB, seed=6)
    sas = _sas(azurite, container.name, "racwl", datetime.now(UTC) + timedelta(hours=1))
    url = f"{proxy.endpoint()}/{container.name}/f.bin"
    journal = str(tmp_path / "j.db")
    proxy.hold_after("put_block", 2)
    kill_when_held(["cp", str(tmp_path / "f.bin"), f"{url}?{sas}", "--journal", journal, "--block-size-mb", "1",
                    "--quiet"], proxy)
    job_id = run(["jobs", "list", "--journal", journal]).stdout.split()[0]
    # The SAS is read as a SAS, apart from the journal's URL: one with a '#' in it (which a URL would cut off)
    # or without a signature is a line before any request, not a 403 after some.
    sent = len(proxy.log)
    for bad in (sas.replace("sig=", "sig=a#"), "sv=2024-01-01&sp=r"):
        refused = run(["jobs", "resume", job_id, "--journal", journal, "--sas", bad, "--quiet"])
        assert refused.returncode == 2 and "is not a SAS token" in _one_error_line(refused.stderr)
        assert sas not in refused.stderr
    assert len(proxy.log) == sent
    # Without credentials the emulator account falls back to its well-known key; a foreign account would
    # need --sas. Here the SAS is passed explicitly and must be the one used.
    resumed = run(["jobs", "resume", job_id, "--journal", journal, "--sas", sas, "--quiet"])
    assert resumed.returncode == 0, resumed.stderr
    resumed_blocks = [e for e in proxy.log if e.op == "put_block"]
    assert resumed_blocks and all("sig" in e.query for e in resumed_blocks)
    assert container.download("f.bin") == data


def test_a_journal_with_damaged_pages_is_one_clear_line_and_exit_2(container: ContainerHandle,
                                                                   tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in range(300):
        random_file(src / f"f{i}.txt", 10, seed=i)
    journal = tmp_path / "j.db"
    first = run(["cp", "-r", "--as-subdir=false", str(src), container.url, "--journal", str(journal), "--quiet"])
    assert first.returncode == 0, first.stderr
    size = journal.stat().st_size
    assert size > 3 * 4096
    with open(journal, "r+b") as f:  # the header page stays valid; every page after it is garbage
        f.seek(4096)
        f.write(bytes(range(256)) * ((size - 4096) // 256 + 1))
    for extra in ("-wal", "-shm"):
        (tmp_path / f"j.db{extra}").unlink(missing_ok=True)
    for args in (["cp", "-r", "--as-subdir=false", str(src), container.url], ["jobs", "list"]):
        done = run([*args, "--journal", str(journal), "--quiet"] if args[0] == "cp" else [*args, "--journal",
                                                                                        str(journal)])
        assert done.returncode == 2, (args, done.stderr)
        line = _one_error_line(done.stderr)
        assert "cannot open the journal" in line and "move it aside" in line


@pytest.mark.parametrize("args", [
    ["cp", "{tmp}/f", "http://127.0.0.1:1/devstoreaccount1/cont", "--progress-interval", "inf"],
    ["sync", "{tmp}", "http://127.0.0.1:1/devstoreaccount1/cont", "--watch", "--settle", "nan"],
    ["jobs", "clean", "--older-than", "nan"],
    ["jobs", "cap", "abc", "inf"],
    ["doctor", "http://127.0.0.1:1/devstoreaccount1/cont", "--timeout", "nan"],
])
def test_number_flags_outside_the_commands_config_refuse_nan_and_inf(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    done = run([a.replace("{tmp}", str(tmp_path)) for a in args], env={"XDG_STATE_HOME": str(tmp_path)})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "out of range" in _one_error_line(done.stderr)
