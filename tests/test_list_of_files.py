"""--list-of-files (AzCopy's flag) on cp: the paths a file names under the source, files or whole folders, in an
upload and in a blob-to-blob copy; a path that matches nothing is a failure of its own, never a silent success."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import ContainerHandle, Side, container_sas
from support.azurite import Azurite
from support.cli import run


def test_an_upload_takes_the_files_and_folders_listed_and_names_a_missing_one(
        container: ContainerHandle, azurite: Azurite, tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    data = {"a.pt": os.urandom(10), "b.pt": os.urandom(10), "logs/x.txt": b"x", "logs/deep/y.txt": b"y",
            "other/z.txt": b"z"}
    for rel, body in data.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(body)
    listing = tmp_path / "list.txt"
    listing.write_text("a.pt\n\n# a comment\nlogs\nmissing.pt\n", encoding="utf-8")
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    out = run(["cp", str(src), container.url, "--list-of-files", str(listing), "--as-subdir=false",
               "--output-type", "json", "--journal", str(tmp_path / "j.db")], env=env)
    assert out.returncode == 1, out.stderr  # one listed path was not there
    assert container.blob_names() == ["a.pt", "logs/deep/y.txt", "logs/x.txt"]
    for rel in ("a.pt", "logs/x.txt", "logs/deep/y.txt"):
        assert container.download(rel) == data[rel]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    failed = [e for e in lines if e.get("type") == "file" and e.get("status") == "failed"]
    assert [e["path"] for e in failed] == ["missing.pt"] and "--list-of-files" in failed[0]["reason"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# nothing\n", encoding="utf-8")
    refused = run(["cp", str(src), container.url, "--list-of-files", str(empty)], env=env)
    assert refused.returncode == 2 and "names nothing" in refused.stderr


def test_a_blob_to_blob_copy_takes_the_blobs_listed(azurite: Azurite, container: ContainerHandle, dest: Side,
                                                    tmp_path: Path) -> None:
    for name in ("run/a.bin", "run/b.bin", "run/sub/c.bin"):
        container.client.upload_blob(name, name.encode())
    source = Side(azurite.account, container.name, container_sas(azurite.account, azurite.key, container.name),
                  container.client)
    listing = tmp_path / "list.txt"
    listing.write_text("b.bin\nsub\n", encoding="utf-8")
    out = run(["cp", source.url(azurite.base_url, "run"), dest.url(azurite.base_url, "x"), "--list-of-files",
               str(listing), "--journal", str(tmp_path / "j.db")])
    assert out.returncode == 0, out.stderr
    assert sorted(b.name for b in dest.client.list_blobs()) == ["x/run/b.bin", "x/run/sub/c.bin"]
    assert dest.download("x/run/sub/c.bin") == b"run/sub/c.bin"
