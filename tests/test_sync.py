"""Sync against Azurite, counting requests through the proxy: filters, no-op re-syncs, deletes, both directions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import ContainerHandle
from support.cli import kill_when_held, random_file, run
from support.proxy import FaultProxy, Rule, respond

INCLUDE = "*.pt;*.h5;*.joblib"
EXCLUDE = "temp_*"


def _tree(root: Path) -> dict[str, bytes]:
    files = {
        "model.pt": 3000, "weights.h5": 10, "clf.joblib": 7, "temp_model.pt": 5, "notes.txt": 4,
        "sub/deep.pt": 2000, "sub/temp_x.h5": 1, "sub/readme.md": 3, "sub dir/naïve.pt": 9,
    }
    return {rel: random_file(root / rel, size, seed=i) for i, (rel, size) in enumerate(files.items())}


def _sync(src: str, dest: str, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    done = run(["sync", src, dest, "--journal", str(tmp_path / "j.db"), "--quiet", *extra])
    assert "Traceback" not in done.stderr
    return done.returncode, done.stdout, done.stderr


def _filtered(*extra: str) -> list[str]:
    return ["--include-pattern", INCLUDE, "--exclude-pattern", EXCLUDE, *extra]


def test_filtered_sync_then_noop_then_one_change(container: ContainerHandle, proxy: FaultProxy,
                                                  tmp_path: Path) -> None:
    src = tmp_path / "models"
    data = _tree(src)
    url = f"{proxy.endpoint()}/{container.name}/run7"
    code, out, err = _sync(str(src), url, tmp_path, *_filtered())
    assert code == 0, err
    expected = {"model.pt", "weights.h5", "clf.joblib", "sub/deep.pt", "sub dir/naïve.pt"}
    assert container.blob_names() == sorted(f"run7/{rel}" for rel in expected)
    for rel in expected:
        assert container.download(f"run7/{rel}") == data[rel]

    proxy.reset_stats()
    code, out, _ = _sync(str(src), url, tmp_path, *_filtered())
    assert code == 0 and "Nothing to do: 5 file(s) already in sync" in out
    writes = {op: n for op, n in proxy.stats.requests.items() if op != "list_blobs"}
    assert writes == {}, writes  # no PUT, no per-blob HEAD: one listing only

    (src / "sub" / "deep.pt").write_bytes(b"new content")
    proxy.reset_stats()
    code, out, _ = _sync(str(src), url, tmp_path, *_filtered())
    assert code == 0
    assert [e.blob for e in proxy.log if e.op in ("put_blob", "put_block")] == ["run7/sub/deep.pt"]
    assert container.download("run7/sub/deep.pt") == b"new content"


def test_same_size_same_mtime_change_needs_compare_hash(container: ContainerHandle, proxy: FaultProxy,
                                                         tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "a.bin", 5000, seed=1)
    url = f"{proxy.endpoint()}/{container.name}"
    assert _sync(str(src), url, tmp_path)[0] == 0
    before = os.stat(src / "a.bin")
    changed = random_file(src / "a.bin", 5000, seed=2)
    os.utime(src / "a.bin", ns=(before.st_atime_ns, before.st_mtime_ns))
    proxy.reset_stats()
    assert "Nothing to do" in _sync(str(src), url, tmp_path)[1]  # size+mtime cannot see it
    code, _, _ = _sync(str(src), url, tmp_path, "--compare-hash", "md5")
    assert code == 0 and proxy.stats.requests["put_blob"] == 1
    assert container.download("a.bin") == changed
    proxy.reset_stats()
    assert "Nothing to do" in _sync(str(src), url, tmp_path, "--compare-hash", "md5")[1]
    assert proxy.stats.requests["put_blob"] == 0


def test_delete_destination_spares_filtered_out_blobs(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "models"
    _tree(src)
    url = f"{container.url}/run7"
    assert _sync(str(src), url, tmp_path, *_filtered())[0] == 0
    container.client.upload_blob("run7/temp_other.pt", b"excluded by pattern")
    container.client.upload_blob("run7/report.txt", b"not included")
    (src / "model.pt").unlink()
    code, out, err = _sync(str(src), url, tmp_path, *_filtered("--delete-destination", "true"))
    assert code == 0, err
    assert "1 deleted" in out
    names = container.blob_names()
    assert "run7/model.pt" not in names
    assert {"run7/temp_other.pt", "run7/report.txt", "run7/weights.h5"} <= set(names)


def test_failed_listing_deletes_nothing(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "keep.bin", 10)
    container.client.upload_blob("orphan.bin", b"x")
    proxy.add_rule(Rule("list_blobs", respond(500, "InternalError")))
    code, _, err = _sync(str(src), f"{proxy.endpoint()}/{container.name}", tmp_path, "--delete-destination", "true",
                         "--max-retries", "1")
    assert code == 1 and "list blobs" in err
    assert container.blob_names() == ["orphan.bin"]


def test_empty_source_and_max_delete_refuse(container: ContainerHandle, tmp_path: Path) -> None:
    for i in range(3):
        container.client.upload_blob(f"f{i}.bin", b"x")
    (tmp_path / "empty").mkdir()
    code, out, _ = _sync(str(tmp_path / "empty"), container.url, tmp_path, "--delete-destination", "true")
    assert code == 0 and "the source is empty" in out
    random_file(tmp_path / "one" / "f0.bin", 1)
    code, out, _ = _sync(str(tmp_path / "one"), container.url, tmp_path, "--delete-destination", "true",
                         "--max-delete", "1")
    assert "2 deletions exceed --max-delete 1" in out
    assert len(container.blob_names()) == 3
    code, out, _ = _sync(str(tmp_path / "one"), container.url, tmp_path, "--delete-destination", "true",
                         "--max-delete", "70%")
    assert code == 0 and container.blob_names() == ["f0.bin"]


def test_failed_upload_deletes_nothing(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "new.bin", 10)
    container.client.upload_blob("orphan.bin", b"x")
    proxy.add_rule(Rule("put_blob", respond(400, "InvalidHeaderValue")))
    code, out, _ = _sync(str(src), f"{proxy.endpoint()}/{container.name}", tmp_path, "--delete-destination", "true")
    assert code == 1 and "some transfers failed" in out
    assert container.blob_names() == ["orphan.bin"]


def test_dry_run_changes_nothing_and_json_lines_parse(container: ContainerHandle, proxy: FaultProxy,
                                                       tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "a.pt", 10)
    container.client.upload_blob("gone.pt", b"x")
    url = f"{proxy.endpoint()}/{container.name}"
    code, out, _ = _sync(str(src), url, tmp_path, "--delete-destination", "true", "--dry-run")
    assert code == 0
    assert "upload   a.pt  (new)" in out and "delete   gone.pt  (not in source)" in out
    code, out, _ = _sync(str(src), url, tmp_path, "--delete-destination", "true", "--dry-run", "--output-type",
                         "json")
    records = [json.loads(line) for line in out.splitlines()]
    assert {(r.get("action"), r.get("path")) for r in records if r["type"] == "action"} == {
        ("upload", "a.pt"), ("delete", "gone.pt")}
    assert records[-1]["type"] == "summary" and records[-1]["dry_run"] is True
    assert container.blob_names() == ["gone.pt"]
    assert all(e.op == "list_blobs" for e in proxy.log)


def test_blob_to_local_with_filters_and_noop(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    data = _tree(tmp_path / "up")
    assert _sync(str(tmp_path / "up"), container.url, tmp_path)[0] == 0
    url = f"{proxy.endpoint()}/{container.name}"
    dest = tmp_path / "down"
    code, _, err = _sync(url, str(dest), tmp_path, *_filtered())
    assert code == 0, err
    got = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert got == {rel: data[rel] for rel in ("model.pt", "weights.h5", "clf.joblib", "sub/deep.pt",
                                               "sub dir/naïve.pt")}
    proxy.reset_stats()
    code, out, _ = _sync(url, str(dest), tmp_path, *_filtered())
    assert code == 0 and "Nothing to do" in out and proxy.stats.requests["get_blob"] == 0


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--include-regex", "("], "invalid --include-regex"),
    (["--include-pattern", "a/b*"], "patterns match file names"),
    (["--include-after", "yesterday"], "invalid --include-after"),
    (["--exclude-path", "../x"], "invalid --exclude-path"),
    (["--delete-destination", "true", "--max-delete", "lots"], "invalid --max-delete"),
    (["--size-only", "--mirror-mode"], "choose one of"),
])
def test_invalid_options_are_usage_errors(flags: list[str], fragment: str, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    code, _, err = _sync(str(tmp_path / "src"), "http://127.0.0.1:1/devstoreaccount1/cont", tmp_path, *flags)
    assert code == 2 and fragment in err


def test_symlinks_are_skipped_with_a_note(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "real.bin", 10)
    (src / "link.bin").symlink_to(src / "real.bin")
    code, out, _ = _sync(str(src), container.url, tmp_path)
    assert code == 0 and "skipped link.bin: symbolic link skipped" in out
    assert container.blob_names() == ["real.bin"]


def test_killed_sync_resumes_at_block_level(container: ContainerHandle, proxy: FaultProxy, tmp_path: Path) -> None:
    src = tmp_path / "models"
    big = random_file(src / "big.pt", 16 * 1024 * 1024 - 5, seed=3)
    small = random_file(src / "small.pt", 100, seed=4)
    args = ["sync", str(src), f"{proxy.endpoint()}/{container.name}", "--journal", str(tmp_path / "j.db"),
            "--block-size-mb", "1", "--concurrency", "4", "--quiet"]
    proxy.hold_after("put_block", 6)
    kill_when_held(args, proxy)
    acked = sum(e.request_bytes for e in proxy.log if e.op == "put_block" and e.status == 201)
    assert acked == 6 * 1024 * 1024
    proxy.reset_stats()
    done = run(args)
    assert done.returncode == 0, done.stderr
    assert proxy.stats.bytes_in["put_block"] == len(big) - acked
    assert container.download("big.pt") == big and container.download("small.pt") == small


def test_invalid_blob_names_are_reported_and_the_rest_continue(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    good = random_file(src / "ok.bin", 10)
    random_file(src / "trailing.", 10)
    random_file(src / "ctl\x01name", 10)
    code, out, _ = _sync(str(src), container.url, tmp_path)
    assert code == 1
    assert "FAILED trailing.:" in out and "ending in '.'" in out and "control characters" in out
    assert container.blob_names() == ["ok.bin"] and container.download("ok.bin") == good


def test_unlistable_source_folder_stops_deletes(container: ContainerHandle, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Root reads every folder, so the unreadable folder is injected where the walk reports it.
    import blobsync
    import blobsync.local.walker as sync_job
    from blobsync.local.files import SkippedEntry

    src = tmp_path / "src"
    random_file(src / "keep.bin", 10)
    container.client.upload_blob("orphan.bin", b"x")
    real_walk = sync_job.walk

    def walk_with_a_locked_folder(root: Path, **kwargs: bool):  # type: ignore[no-untyped-def]
        yield SkippedEntry(root / "locked", "locked", "cannot list folder: Permission denied")
        yield from real_walk(root, **kwargs)

    monkeypatch.setattr(sync_job, "walk", walk_with_a_locked_folder)
    monkeypatch.setenv("BLOBSYNC_WALK_PROCESS", "0")  # the walk in this process, where the patch is
    config = blobsync.TransferConfig(journal_path=tmp_path / "j.db")
    report = blobsync.sync(src, container.url, config, delete=blobsync.DeleteMode.TRUE, env={})
    assert "could not be enumerated completely" in report.deletes_refused
    assert report.files_failed == 1 and report.failures[0].rel == "locked"
    assert container.blob_names() == ["keep.bin", "orphan.bin"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists every folder whatever its mode")
def test_unreadable_source_folder_stops_deletes(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src / "keep.bin", 10)
    random_file(src / "locked" / "x.bin", 10)
    (src / "locked").chmod(0)
    container.client.upload_blob("orphan.bin", b"x")
    try:
        code, out, _ = _sync(str(src), container.url, tmp_path, "--delete-destination", "true")
    finally:
        (src / "locked").chmod(0o755)
    assert code == 1 and "could not be enumerated completely" in out
    assert "orphan.bin" in container.blob_names()


def test_multi_page_listing_is_complete_and_in_order(container: ContainerHandle, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages are fetched one ahead of parsing; with 3 blobs a page, 11 blobs span 4 pages."""
    import blobsync
    from blobsync import TransferConfig
    from blobsync.backends.azure.store import AzureContainerStore

    monkeypatch.setattr(AzureContainerStore, "page_size", 3)
    names = [f"p/{name}" for name in ("a&b", "c<d", "e f", *(f"n{i:02d}" for i in range(8)))]
    for name in names:
        container.client.upload_blob(name, name.encode())
    assert [p.name for p in blobsync.list_blobs(container.url + "/p")] == sorted(names)
    src = tmp_path / "src"
    for name in names:
        (src / name[2:]).parent.mkdir(parents=True, exist_ok=True)
        (src / name[2:]).write_bytes(name.encode())
    report = blobsync.sync(src, container.url + "/p", TransferConfig(journal_path=tmp_path / "j.db"),
                           compare=blobsync.CompareMode.SIZE_ONLY)
    assert report.files_in_sync == len(names) and report.files_transferred == 0


def test_sync_asks_for_the_next_page_before_parsing_this_one(container: ContainerHandle, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The service prepares page n+1 while page n is parsed: its request must have left by then."""
    import blobsync
    from blobsync.backends.azure import listing as azure_listing, store as azure_store
    from blobsync.backends.azure.store import AzureContainerStore

    monkeypatch.setattr(AzureContainerStore, "page_size", 3)
    for i in range(7):
        container.client.upload_blob(f"b{i}", b"x")
        random_file(tmp_path / "src" / f"b{i}", 1)
    requested: list[str] = []
    list_body, parse = AzureContainerStore._list_body, azure_listing.parse_listing

    async def spy_list_body(self: AzureContainerStore, prefix: str, marker: str, size: int | None = None,
                            **kwargs: Any) -> bytes:
        requested.append(marker)
        return await list_body(self, prefix, marker, size, **kwargs)

    requested_at_parse: list[int] = []

    def spy_parse(body: bytes) -> tuple[list[blobsync.BlobProperties], str]:
        requested_at_parse.append(len(requested))
        return parse(body)

    monkeypatch.setattr(AzureContainerStore, "_list_body", spy_list_body)
    monkeypatch.setattr(azure_store, "parse_listing", spy_parse)
    report = blobsync.sync(tmp_path / "src", container.url,
                           blobsync.TransferConfig(journal_path=tmp_path / "j.db"),
                           compare=blobsync.CompareMode.SIZE_ONLY)
    assert report.files_in_sync == 7
    assert requested_at_parse == [2, 3, 3]  # pages of 3, 3 and 1 blobs: no fourth request


def test_listing_keeps_the_expected_last_page_small(container: ContainerHandle, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    """When the caller's estimate says the rest fits in one page, it comes as a page and a small last page; an
    estimate that was short costs one more page, never a missing blob."""
    import asyncio

    from blobsync import TransferConfig
    from blobsync.backends.azure.store import AzureContainerStore
    from blobsync.backends.registry import open_store

    monkeypatch.setattr(AzureContainerStore, "page_size", 16)
    names = [f"n{i:02d}" for i in range(40)]
    for name in names:
        container.client.upload_blob(name, b"x")
    sizes: list[int | None] = []
    list_body = AzureContainerStore._list_body

    async def spy(self: AzureContainerStore, prefix: str, marker: str, size: int | None = None,
                  **kwargs: Any) -> bytes:
        sizes.append(size)
        return await list_body(self, prefix, marker, size, **kwargs)

    monkeypatch.setattr(AzureContainerStore, "_list_body", spy)

    async def listed(expected: int | None) -> list[str]:
        store = open_store(container.url, TransferConfig(), os.environ)
        try:
            return [p.name async for p in store.list_objects(expected=lambda: expected)]
        finally:
            await store.close()

    assert asyncio.run(listed(40)) == names and sizes == [16, 16, 7, 16]  # 40 - 32 = 8 left: 7, then 1
    sizes.clear()
    assert asyncio.run(listed(30)) == names and sizes == [16, 13, 16]  # 14 left by the estimate: 13, then 11
    sizes.clear()
    assert asyncio.run(listed(None)) == names and sizes == [16, 16, 16]


def test_noop_sync_never_opens_the_journal(container: ContainerHandle, tmp_path: Path) -> None:
    import blobsync
    from blobsync import TransferConfig

    src = tmp_path / "src"
    _tree(src)
    first = blobsync.sync(src, container.url, TransferConfig(journal_path=tmp_path / "j.db"))
    assert first.files_transferred > 0 and (tmp_path / "j.db").exists()
    fresh = tmp_path / "state" / "fresh.db"
    again = blobsync.sync(src, container.url, TransferConfig(journal_path=fresh))
    assert again.files_transferred == 0 and again.files_in_sync == first.files_transferred
    assert not fresh.exists()  # nothing to do, so nothing was written (not even an empty journal)
