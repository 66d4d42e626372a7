"""A large local tree is walked in a process of its own (issue 52): the same entries and the same skipped entries
as the walk in this process, a sync through it moves the right bytes both ways, and its process never outlives a
cancelled walk."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from pathlib import Path

import pytest

import blobsync
from blobsync.config import TransferConfig
from blobsync.filters import Filters
from blobsync.journal.index import SyncIndex
from blobsync.local import child
from blobsync.local.files import SkippedEntry
from blobsync.local.walker import in_process, index_in_process, tree_entries
from conftest import ContainerHandle
from support.cli import random_file, run


def _tree(root: Path) -> None:
    for rel in ("a.pt", "b/c.pt", "b/d.txt", "b/e/f.h5", "sp ace/ünï.pt", "back\\slash.pt", "skip/x.pt"):
        random_file(root / rel, 3, seed=len(rel))
    os.symlink(root / "a.pt", root / "link.pt")  # skipped (no --follow-symlinks), and said so
    os.mkfifo(root / "pipe.pt")  # not a regular file: skipped


def _walked(root: Path, filters: Filters, upload: bool, how: str) -> tuple[list[tuple[object, ...]], list[str]]:
    async def go() -> tuple[list[tuple[object, ...]], list[str]]:
        index = SyncIndex(root.parent / "scratch")
        skipped: list[SkippedEntry] = []
        try:
            if how == "process":
                skipped = await index_in_process(index, "src", root, filters, follow_symlinks=False, upload=upload,
                                                 seen=lambda count: None)
            else:
                index.add("src", tree_entries(root, filters, follow_symlinks=False, upload=upload,
                                              skipped=skipped.append))
            return ([(e.rel, e.size, e.mtime_ns, e.inode, e.name) for e in index.entries("src")],
                    sorted(f"{s.rel}: {s.reason}" for s in skipped))
        finally:
            index.close()

    return asyncio.run(go())


@pytest.mark.parametrize("upload", [True, False], ids=["source", "target"])
def test_the_walk_in_a_process_gives_what_the_walk_here_gives(tmp_path: Path, upload: bool) -> None:
    root = tmp_path / "tree"
    _tree(root)
    filters = Filters.parse(include_pattern="*.pt;*.h5", exclude_path="skip/")
    here = _walked(root, filters, upload, "here")
    there = _walked(root, filters, upload, "process")
    assert there == here
    assert {rel for rel, *_ in here[0]} >= {"a.pt", "b/c.pt", "b/e/f.h5", "sp ace/ünï.pt"}
    assert any("symbolic link" in s for s in here[1]) and any("not a regular file" in s for s in here[1])
    assert list((tmp_path / "scratch").iterdir()) == []  # the process's index file is taken in and deleted


def test_a_cancelled_walk_leaves_no_process(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for i in range(2000):
        (root / f"d{i % 50}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 50}" / f"f{i}").write_bytes(b"")

    async def go() -> None:
        index = SyncIndex(tmp_path / "scratch")
        try:
            walk = asyncio.create_task(index_in_process(index, "src", root, Filters(), follow_symlinks=False,
                                                        upload=True, seen=lambda count: None))
            await asyncio.sleep(0.05)
            walk.cancel()
            with pytest.raises(asyncio.CancelledError):
                await walk
        finally:
            index.close()

    asyncio.run(go())
    assert multiprocessing.active_children() == []
    assert list((tmp_path / "scratch").iterdir()) == []  # nor its index file


def test_which_trees_are_walked_in_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "small").mkdir()
    for i in range(70):
        (tmp_path / "wide" / f"d{i}").mkdir(parents=True)
    assert not in_process(tmp_path / "wide", {})  # a library call: the host's process is left alone
    monkeypatch.setattr(child, "_OWN_PROCESS", True)  # as the command's entry point sets it
    assert not in_process(tmp_path / "small", {})
    assert in_process(tmp_path / "wide", {}) == ((os.cpu_count() or 1) >= 2)
    assert in_process(tmp_path / "small", {"BLOBSYNC_WALK_PROCESS": "1"})
    assert not in_process(tmp_path / "wide", {"BLOBSYNC_WALK_PROCESS": "0"})


@pytest.mark.parametrize("workers", [[], ["--processes", "2"]], ids=["plain", "processes"])
def test_a_sync_walked_in_a_process_moves_the_right_bytes_both_ways(container: ContainerHandle, tmp_path: Path,
                                                                    azurite_env: str, workers: list[str]) -> None:
    src = tmp_path / "src"
    files = {f"d{i % 3}/f{i}.bin": random_file(src / f"d{i % 3}" / f"f{i}.bin", 100 + i, seed=i) for i in range(12)}
    env = {"BLOBSYNC_WALK_PROCESS": "1"}
    journal = ["--journal", str(tmp_path / "j.db"), *workers]
    up = run(["sync", str(src), container.url, *journal], env=env)
    assert up.returncode == 0, up.stderr
    assert {name: container.download(name) for name in container.blob_names()} == files
    again = run(["sync", str(src), container.url, *journal], env=env)
    assert again.returncode == 0 and "already in sync" in again.stdout
    down = tmp_path / "down"
    assert run(["sync", container.url, str(down), *journal], env=env).returncode == 0
    assert {str(p.relative_to(down)): p.read_bytes() for p in down.rglob("*") if p.is_file()} == files
    (down / "d0" / "f0.bin").write_bytes(b"changed locally")  # newer and another size: the blob's copy wins
    os.utime(down / "d0" / "f0.bin", (0, 0))
    assert run(["sync", container.url, str(down), *journal], env=env).returncode == 0
    assert (down / "d0" / "f0.bin").read_bytes() == files["d0/f0.bin"]


def test_where_no_process_starts_the_tree_is_walked_here(container: ContainerHandle, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    files = {f"d{i % 3}/f{i}.bin": random_file(src / f"d{i % 3}" / f"f{i}.bin", 50 + i, seed=i) for i in range(6)}

    def refused(self: object) -> None:
        raise OSError(38, "Function not implemented")  # as a sandbox without shared memory answers

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refused)
    monkeypatch.setenv("BLOBSYNC_WALK_PROCESS", "1")
    report = blobsync.sync(src, container.url, TransferConfig(journal_path=tmp_path / "j.db"))
    assert report.ok and report.files_transferred == len(files)
    assert {name: container.download(name) for name in container.blob_names()} == files
