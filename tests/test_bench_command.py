"""`blobsync bench URL` (issue 29, part 3): generated files up to a folder of its own and down again, measured,
with what bounded each phase; the folder deleted after (and only it); bad input gets one line."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ContainerHandle
from support.azurite import Azurite
from support.cli import run


def test_bench_measures_both_ways_and_leaves_the_container_as_it_was(container: ContainerHandle, azurite: Azurite,
                                                                    tmp_path: Path) -> None:
    container.client.upload_blob("keep.txt", b"not the bench's")
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    out = run(["bench", container.url, "--size-per-file", "256K", "--file-count", "12", "--output-type", "json",
               "--journal", str(tmp_path / "j.db")], env=env)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["type"] == "bench" and record["deleted"] == 12 and "/blobsync-bench-" in record["folder"]
    up, down = record["phases"]
    assert (up["phase"], down["phase"]) == ("upload", "download")
    for phase in (up, down):
        assert phase["files"] == 12 and phase["bytes"] == 12 * 256 * 1024 and phase["failed"] == 0
        assert phase["mb_per_s"] > 0 and phase["bound"] and phase["concurrency"] >= 1
    assert container.blob_names() == ["keep.txt"]  # only what it made is gone


def test_bench_can_keep_its_data_and_refuses_bad_input(container: ContainerHandle, azurite: Azurite,
                                                      tmp_path: Path) -> None:
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    journal = ["--journal", str(tmp_path / "j.db")]
    kept = run(["bench", container.url, "--size-per-file", "4K", "--file-count", "3", "--mode", "upload",
                "--no-delete-test-data", *journal], env=env)
    assert kept.returncode == 0, kept.stderr
    assert "upload" in kept.stdout and "download" not in kept.stdout and "bounded by" in kept.stdout
    names = container.blob_names()
    assert len(names) == 3 and all(n.startswith("blobsync-bench-") for n in names)
    for args, words, code in ((["--size-per-file", "lots"], "invalid --size-per-file", 2),
                              (["--file-count", "0"], "file-count", 2)):
        out = run(["bench", container.url, *args, *journal], env=env)
        assert out.returncode == code and words in out.stderr and "Traceback" not in out.stderr, out.stderr
    missing = run(["bench", f"{azurite.blob_endpoint}/no-such-container", "--size-per-file", "1K",
                   "--file-count", "1", *journal], env=env)
    assert missing.returncode != 0 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
