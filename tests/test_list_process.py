"""A blob-to-blob sync's source listed by a process of its own (issue 52): the same entries and the same bytes as a
listing here, every hostile name included; the child's failure raised as its own error, its retries counted; no
process and no scratch file left after a cancel; and never where the child could not keep a promise this process
keeps (a Client's credential object, a bandwidth cap, a store in this process)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

import blobsync
from blobsync.backends.registry import parse_location
from blobsync.config import TransferConfig
from blobsync.engine import list_process, listing
from blobsync.engine.session import Session
from blobsync.errors import AuthError
from blobsync.journal import Journal
from conftest import Side
from support.proxy import FaultProxy, Rule, respond, stall

# Names a listing must carry through its child and the scratch index: XML's characters, percent and plus signs,
# non-ASCII, doubled slashes, a folder sharing a prefix with another, and deeper levels.
NAMES = ["top.bin", "f0/a&b<c>'\"q.txt", "f1/sp ace%20x+y.bin", "f2/naïve/日本語.txt", "f3/🙂.bin", "f3//dbl.bin",
         "f4/a/b/c/d.bin", "f4b/x.bin", *(f"f{i}/n{j}.bin" for i in range(5, 9) for j in range(3))]
FORCED = {"BLOBSYNC_LIST_PROCESS": "1"}


def _fill(side: Side) -> dict[str, bytes]:
    files = {name: os.urandom(64 + i) for i, name in enumerate(NAMES)}
    for name, data in files.items():
        side.client.upload_blob(f"data/{name}", data)
    return files


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The prefixes each listing process was handed (the real process still runs)."""
    handed: list[list[str]] = []
    real = list_process.run_child

    async def spied(target: Any, args: tuple[Any, ...], name: str, seen: Any) -> tuple[str, Any]:
        handed.append(list(args[6]))
        return await real(target, args, name, seen)

    monkeypatch.setattr(list_process, "run_child", spied)
    return handed


def _sync(source: Side, dest: Side, endpoint: str, tmp_path: Path, **kwargs: Any) -> blobsync.Report:
    config = TransferConfig(journal_path=tmp_path / "j.db")
    return blobsync.sync(source.url(endpoint, "data"), dest.url(endpoint, "mirror"), config, env=FORCED, **kwargs)


def test_the_source_listed_in_a_process_gives_the_same_bytes(source: Side, dest: Side, proxy: FaultProxy,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _fill(source)
    handed = _spy(monkeypatch)
    report = _sync(source, dest, proxy.url, tmp_path)
    assert report.ok and report.files_transferred == len(files)
    assert handed and all(p.startswith("data/") for p in handed[0])  # the folders went to the process
    assert {name: dest.download(f"mirror/{name}") for name in files} == files
    assert sorted(b.name for b in dest.client.list_blobs()) == sorted(f"mirror/{n}" for n in files)
    again = _sync(source, dest, proxy.url, tmp_path)
    assert again.files_transferred == 0 and again.files_in_sync == len(files)
    assert not list(tmp_path.glob("blobsync-list-*"))  # the scratch index is gone


def test_the_process_failure_is_its_own_error_and_its_retries_count(source: Side, dest: Side, proxy: FaultProxy,
                                                                    tmp_path: Path) -> None:
    files = _fill(source)
    proxy.add_rule(Rule("list_blobs", respond(503, "ServerBusy"), blob="data/f5/", times=1))
    report = _sync(source, dest, proxy.url, tmp_path)
    assert report.ok and report.files_transferred == len(files) and report.retries >= 1
    proxy.clear_rules()
    proxy.add_rule(Rule("list_blobs", respond(403, "AuthorizationPermissionMismatch"), blob="data/f6/"))
    source.client.upload_blob("data/f7/new.bin", b"new")
    with pytest.raises(AuthError) as caught:
        _sync(source, dest, proxy.url, tmp_path)
    assert caught.value.exit_code == blobsync.ExitCode.AUTH
    assert "mirror/f7/new.bin" not in [b.name for b in dest.client.list_blobs()]  # nothing copied on a failed listing


def test_a_cancelled_sync_leaves_no_listing_process_and_no_scratch_file(source: Side, dest: Side, proxy: FaultProxy,
                                                                       tmp_path: Path) -> None:
    _fill(source)
    proxy.add_rule(Rule("list_blobs", stall(30), blob="data/f8/"))
    config = TransferConfig(journal_path=tmp_path / "j.db")

    async def cancel_while_listing() -> None:
        task = asyncio.create_task(blobsync.aio.sync(source.url(proxy.url, "data"), dest.url(proxy.url, "mirror"),
                                                     config, env=FORCED))
        for _ in range(300):
            await asyncio.sleep(0.05)
            if any(p.name == "blobsync-list" for p in multiprocessing.active_children()):
                break
        assert any(p.name == "blobsync-list" for p in multiprocessing.active_children())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_while_listing())
    assert not [p for p in multiprocessing.active_children() if p.name == "blobsync-list"]
    assert not list(tmp_path.glob("blobsync-list-*"))


def test_never_where_the_process_could_not_keep_a_promise(source: Side, tmp_path: Path) -> None:
    async def check() -> None:
        url = source.url("http://127.0.0.1:1", "data")
        loc = parse_location(url)
        journal = tmp_path / "j.db"
        plain = Session(TransferConfig(), FORCED, lambda: Journal(journal))
        capped = TransferConfig(cap_mbps=100)
        memory = parse_location("memory://list-process/data")
        library = Session(TransferConfig(), {}, lambda: Journal(journal))
        bare = f"http://127.0.0.1:1/{source.account}/{source.name}"  # signed by the Client's credential, no SAS
        client = Session(TransferConfig(), FORCED, lambda: Journal(journal), credential=object(), home=bare)
        try:
            assert list_process.flat_lister(plain, loc, TransferConfig()) is not None
            assert list_process.flat_lister(plain, loc, capped) is None  # the job's one bucket
            assert list_process.flat_lister(plain, memory, TransferConfig()) is None  # this process's
            assert list_process.flat_lister(library, loc, TransferConfig()) is None  # a library call
            assert list_process.flat_lister(client, parse_location(bare + "/data"), TransferConfig()) is None
        finally:
            for session in (plain, library, client):
                await session.close()

    asyncio.run(check())


def test_a_level_too_wide_to_fan_out_is_listed_flat_by_the_process(source: Side, dest: Side, proxy: FaultProxy,
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    files = _fill(source)
    monkeypatch.setattr(listing, "FANOUT_MAX", 3)  # the source's top has more folders: listed flat, over there
    handed = _spy(monkeypatch)
    report = _sync(source, dest, proxy.url, tmp_path)
    assert report.ok and report.files_transferred == len(files)
    assert handed == [["data/"]]
    assert {name: dest.download(f"mirror/{name}") for name in files} == files


def test_where_no_process_starts_the_source_is_listed_here(source: Side, dest: Side, proxy: FaultProxy,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _fill(source)

    def refused(self: object) -> None:
        raise OSError(38, "Function not implemented")  # as a sandbox without shared memory answers

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refused)
    report = _sync(source, dest, proxy.url, tmp_path)
    assert report.ok and report.files_transferred == len(files)
    assert {name: dest.download(f"mirror/{name}") for name in files} == files
