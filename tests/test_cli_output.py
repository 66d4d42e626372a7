"""What the terminal and scripts see: JSON lines, periodic plain progress, logs apart from output, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import random_file, run
from support.proxy import FaultProxy, Rule, stall


def _json_lines(stdout: str) -> list[dict[str, object]]:
    records = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert records, "no output"
    return records


def test_cp_json_output_is_only_json_lines(container: ContainerHandle, tmp_path: Path, azurite_env: str) -> None:
    src = tmp_path / "src"
    files = {f"d/f{i}.bin": random_file(src / "d" / f"f{i}.bin", 2 * MiB + i, seed=i) for i in range(3)}
    done = run(["cp", "-r", "--as-subdir=false", str(src), container.url + "/out", "--journal", str(tmp_path / "j.db"),
                "--block-size-mb", "1", "--cap-mbps", "40", "--output-type", "json", "--progress-interval", "0.2"])
    assert done.returncode == 0, done.stderr
    records = _json_lines(done.stdout)  # every line parses
    kinds = [r["type"] for r in records]
    assert kinds[0] == "start" and kinds[-1] == "summary"
    assert records[0]["command"] == "cp" and records[0]["destination"] == container.url + "/out"
    file_records = [r for r in records if r["type"] == "file"]
    assert sorted(str(r["path"]) for r in file_records) == sorted(files)
    assert all(r["status"] == "transferred" for r in file_records)
    progress = [r for r in records if r["type"] == "progress"]
    assert progress, "a ~1.5 s transfer with --progress-interval 0.2 reports progress"
    assert all(0 <= int(str(p["bytes_done"])) <= int(str(p["bytes_total"])) for p in progress)
    summary = records[-1]
    assert summary["files_transferred"] == 3 and summary["exit_code"] == 0
    for rel, data in files.items():
        assert container.download(f"out/{rel}") == data


def test_fatal_error_in_json_mode_is_a_json_line_too(tmp_path: Path, azurite_env: str, azurite: object) -> None:
    (tmp_path / "f").write_bytes(b"x")
    url = f"{azurite.blob_endpoint}/no-such-container"  # type: ignore[attr-defined]
    done = run(["cp", str(tmp_path / "f"), url, "--journal", str(tmp_path / "j.db"), "--output-type", "json"])
    assert done.returncode == 1
    records = _json_lines(done.stdout)
    assert records[-1]["type"] == "error" and "does not exist" in str(records[-1]["message"])
    assert "Traceback" not in done.stderr


def test_plain_progress_lines_when_not_a_terminal(container: ContainerHandle, tmp_path: Path,
                                                  azurite_env: str) -> None:
    data = random_file(tmp_path / "a.bin", 6 * MiB)
    done = run(["cp", str(tmp_path / "a.bin"), container.url, "--journal", str(tmp_path / "j.db"),
                "--block-size-mb", "1", "--cap-mbps", "40", "--progress-interval", "0.2"])
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "files" in line]
    assert len(lines) >= 2, done.stderr
    assert "\r" not in done.stderr and "\x1b" not in done.stderr  # no terminal control codes in a log
    assert "%" in lines[-1] and "MiB" in lines[-1]
    assert done.stdout.startswith("Job ")
    assert container.download("a.bin") == data


def test_log_file_keeps_logs_out_of_stderr(container: ContainerHandle, tmp_path: Path, azurite_env: str) -> None:
    random_file(tmp_path / "a.bin", 3 * MiB)
    log = tmp_path / "blobsync.log"
    done = run(["cp", str(tmp_path / "a.bin"), container.url, "--journal", str(tmp_path / "j.db"),
                "--block-size-mb", "1", "--quiet", "--log-level", "DEBUG", "--log-file", str(log)])
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "DEBUG" in log.read_text() or "INFO" in log.read_text()


def test_sync_json_reports_each_file_and_deletes(container: ContainerHandle, tmp_path: Path,
                                                 azurite_env: str) -> None:
    src = tmp_path / "src"
    random_file(src / "a.bin", 1000)
    container.client.upload_blob("s/orphan.bin", b"old")
    done = run(["sync", str(src), container.url + "/s", "--journal", str(tmp_path / "j.db"),
                "--delete-destination", "true", "--output-type", "json"])
    assert done.returncode == 0, done.stderr
    records = _json_lines(done.stdout)
    by_type = {(r["type"], r.get("status") or r.get("action")): r for r in records}
    assert ("file", "transferred") in by_type and by_type[("file", "transferred")]["path"] == "a.bin"
    assert ("file", "deleted") in by_type and by_type[("file", "deleted")]["path"] == "orphan.bin"
    assert records[-1]["type"] == "summary" and records[-1]["files_deleted"] == 1
    assert container.blob_names() == ["s/a.bin"]


def test_live_progress_redraws_one_line_on_a_terminal(container: ContainerHandle, tmp_path: Path,
                                                      azurite_env: str) -> None:
    import os
    import pty
    import subprocess

    from support.cli import blobsync_cmd, clean_env

    data = random_file(tmp_path / "a.bin", 6 * MiB)
    leader, follower = pty.openpty()
    with subprocess.Popen(blobsync_cmd("cp", str(tmp_path / "a.bin"), container.url, "--journal",
                                       str(tmp_path / "j.db"), "--block-size-mb", "1", "--cap-mbps", "40",
                                       "--progress-interval", "0.1"),
                          env=clean_env(), stdout=subprocess.PIPE, stderr=follower) as proc:
        os.close(follower)
        screen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the pty closes when the process exits
                break
            if not chunk:
                break
            screen += chunk
        out = proc.stdout.read().decode() if proc.stdout else ""
    os.close(leader)
    assert proc.returncode == 0
    assert screen.count(b"\r\x1b[K") >= 3  # redrawn in place, then cleared
    assert b"files 0/1" in screen or b"files 1/1" in screen
    assert out.startswith("Job ") and "1 uploaded" in out
    assert container.download("a.bin") == data


def test_a_sync_reports_its_enumeration_as_it_lists(container: ContainerHandle, tmp_path: Path, azurite_env: str,
                                                    proxy: FaultProxy) -> None:
    """Before anything moves, a sync of millions spends minutes listing: progress says how far each side got."""
    src = tmp_path / "src"
    for i in range(30):  # 10 at the top (listed with the first page), 20 in two folders (listed after it)
        random_file(src / (f"d{i % 2}" if i >= 10 else "") / f"f{i}.bin", 10, seed=i)
    assert run(["sync", str(src), container.url, "--journal", str(tmp_path / "j.db")]).returncode == 0
    proxy.add_rule(Rule("list_blobs", stall(0.4)))  # each listing page takes 0.4 s
    done = run(["sync", str(src), f"{proxy.endpoint()}/{container.name}", "--journal", str(tmp_path / "j.db"),
                "--output-type", "json", "--progress-interval", "0.1"])
    assert done.returncode == 0, done.stderr
    progress = [r for r in _json_lines(done.stdout) if r["type"] == "progress"]
    listing = [r for r in progress if r["listing"]]
    assert listing, progress
    assert all(r["listed_source"] == 30 for r in listing[-1:])  # the local walk is done long before the listing
    seen = [int(str(r["listed_destination"])) for r in listing]
    assert seen == sorted(seen) and 10 <= seen[-1] <= 30  # it grows as the pages come
