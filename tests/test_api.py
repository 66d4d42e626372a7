"""The library as pipelines use it: blocking and async calls, subscribers, raise_on_error, cancel and resume."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import sqlite3
from pathlib import Path

import pytest
from azure.storage.blob import ContentSettings

import blobsync
from blobsync import BaseSubscriber, FileResult, FileStatus, QueuedFile, TransferConfig
from blobsync.config import MiB
from conftest import ContainerHandle
from support.cli import random_file


class Recorder(BaseSubscriber):
    def __init__(self) -> None:
        self.queued: list[QueuedFile] = []
        self.progress: dict[str, int] = {}
        self.done: list[FileResult] = []

    def on_queued(self, file: QueuedFile) -> None:
        self.queued.append(file)

    def on_progress(self, rel: str, nbytes: int) -> None:
        self.progress[rel] = self.progress.get(rel, 0) + nbytes

    def on_done(self, result: FileResult) -> None:
        self.done.append(result)


def _config(tmp_path: Path, **kwargs: object) -> TransferConfig:
    return TransferConfig.from_mib(block_size_mb=1, journal_path=tmp_path / "j.db", **kwargs)


def test_public_names_are_exported_and_typed() -> None:
    for name in blobsync.__all__:
        assert hasattr(blobsync, name), name
    assert (Path(blobsync.__file__).parent / "py.typed").exists()
    for name in ("copy", "sync", "resume", "list_blobs", "remove"):
        assert asyncio.iscoroutinefunction(getattr(blobsync.aio, name)) or name == "list_blobs"


def test_subscriber_sees_queued_progress_and_done_for_every_file(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = {f"f{i}.bin": random_file(src / f"f{i}.bin", size, seed=i)
             for i, size in enumerate([0, 1000, 3 * MiB + 5])}
    recorder = Recorder()
    report = blobsync.copy(src, container.url, _config(tmp_path, recursive=True), subscribers=[recorder],
                           as_subdir=False)

    assert report.files_transferred == 3 and report.ok
    assert sorted(q.rel for q in recorder.queued) == sorted(files)
    assert {q.rel: q.size for q in recorder.queued} == {rel: len(data) for rel, data in files.items()}
    assert sorted(r.rel for r in recorder.done) == sorted(files)
    assert all(r.status is FileStatus.TRANSFERRED for r in recorder.done)
    # Progress adds up to each file's size (the empty file has nothing to report).
    assert {rel: n for rel, n in recorder.progress.items() if n} == {r: len(d) for r, d in files.items() if d}
    for rel, data in files.items():
        assert container.download(rel) == data


def test_a_raising_subscriber_never_breaks_the_transfer(container: ContainerHandle, tmp_path: Path) -> None:
    class Broken(BaseSubscriber):
        def on_progress(self, rel: str, nbytes: int) -> None:
            raise RuntimeError("bug in a callback")

    data = random_file(tmp_path / "a.bin", 2 * MiB + 1)
    report = blobsync.copy(tmp_path / "a.bin", container.url + "/a.bin", _config(tmp_path), subscribers=[Broken()])
    assert report.ok
    assert container.download("a.bin") == data


def _blob_with_wrong_md5(container: ContainerHandle, name: str, data: bytes) -> None:
    wrong = hashlib.md5(b"something else").digest()
    blob = container.client.upload_blob(name, data)
    blob.set_http_headers(ContentSettings(content_type="application/octet-stream", content_md5=bytearray(wrong)))


def test_failures_are_in_the_report_or_raised_when_asked(container: ContainerHandle, tmp_path: Path) -> None:
    good = random_file(tmp_path / "good.bin", 5000, seed=1)
    container.client.upload_blob("d/good.bin", good)
    _blob_with_wrong_md5(container, "d/bad.bin", b"payload" * 100)

    report = blobsync.copy(container.url + "/d", str(tmp_path / "out") + "/", _config(tmp_path, recursive=True))
    assert report.files_transferred == 1 and report.files_failed == 1
    assert report.failures[0].rel == "bad.bin" and "MD5" in report.failures[0].reason
    assert report.exit_code == blobsync.ExitCode.INTEGRITY
    assert (tmp_path / "out" / "d" / "good.bin").read_bytes() == good  # the prefix is a level (AzCopy's layout)
    assert not (tmp_path / "out" / "d" / "bad.bin").exists()

    with pytest.raises(blobsync.TransferFailedError) as caught:
        blobsync.copy(container.url + "/d", str(tmp_path / "out2") + "/", _config(tmp_path, recursive=True),
                      raise_on_error=True)
    assert caught.value.exit_code == blobsync.ExitCode.INTEGRITY
    assert caught.value.report.failures[0].rel == "bad.bin"
    assert "bad.bin" in str(caught.value)


def test_async_twins_run_inside_an_existing_loop(container: ContainerHandle, tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = random_file(src / "x" / "model.pt", 3 * MiB, seed=3)

    async def pipeline() -> tuple[blobsync.Report, blobsync.Report, list[str]]:
        up = await blobsync.aio.sync(src, container.url + "/run1", _config(tmp_path))
        # The blocking form works from inside a running loop too (as in a notebook): it gets its own loop.
        again = blobsync.sync(src, container.url + "/run1", _config(tmp_path))
        names = [p.name async for p in blobsync.aio.list_blobs(container.url + "/run1")]
        return up, again, names

    up, again, names = asyncio.run(pipeline())
    assert up.files_transferred == 1 and again.files_transferred == 0 and again.files_in_sync == 1
    assert names == ["run1/x/model.pt"]
    assert container.download("run1/x/model.pt") == data


def test_cancelled_copy_leaves_a_resumable_job(container: ContainerHandle, tmp_path: Path) -> None:
    data = random_file(tmp_path / "big.bin", 24 * MiB, seed=7)
    config = _config(tmp_path, concurrency=2, cap_mbps=80)  # ~10 MB/s: the cancel lands mid-file

    async def cancel_midway() -> None:
        started = asyncio.Event()

        class Watch(BaseSubscriber):
            seen = 0

            def on_progress(self, rel: str, nbytes: int) -> None:
                self.seen += nbytes
                if self.seen >= 4 * MiB:
                    started.set()

        task = asyncio.create_task(blobsync.aio.copy(tmp_path / "big.bin", container.url + "/big.bin", config,
                                                     subscribers=[Watch()]))
        await asyncio.wait_for(started.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    with sqlite3.connect(tmp_path / "j.db") as db:
        job_id, state = db.execute("select id, state from jobs").fetchone()
        blocks = db.execute("select count(*) from blocks").fetchone()[0]
    assert state == "interrupted" and blocks >= 4
    assert "big.bin" not in container.blob_names()  # nothing committed half-way

    report = blobsync.resume(job_id, journal_path=tmp_path / "j.db", overrides={"cap_mbps": None})
    assert report.ok and report.bytes_reused >= 4 * MiB
    assert container.download("big.bin") == data
    props = container.client.get_blob_client("big.bin").get_blob_properties()
    assert base64.b64encode(props.content_settings.content_md5).decode() == \
        base64.b64encode(hashlib.md5(data).digest()).decode()


def test_list_and_remove_from_the_library(container: ContainerHandle, tmp_path: Path) -> None:
    for name in ("keep/a.txt", "tmp/b.log", "tmp/c.txt", "tmpfile"):
        container.client.upload_blob(name, name.encode())
    listed = blobsync.list_blobs(container.url + "/tmp")
    assert sorted(p.name for p in listed) == ["tmp/b.log", "tmp/c.txt"]  # not 'tmpfile': only the folder

    dry = blobsync.remove(container.url + "/tmp", recursive=True, dry_run=True)
    assert dry.files_deleted == 2 and container.blob_names() == ["keep/a.txt", "tmp/b.log", "tmp/c.txt", "tmpfile"]

    only_logs = blobsync.remove(container.url + "/tmp", recursive=True,
                                filters=blobsync.Filters.parse(include_pattern="*.log"))
    assert only_logs.files_deleted == 1
    assert container.blob_names() == ["keep/a.txt", "tmp/c.txt", "tmpfile"]

    one = blobsync.remove(container.url + "/tmpfile")
    assert one.files_deleted == 1 and container.blob_names() == ["keep/a.txt", "tmp/c.txt"]
    with pytest.raises(blobsync.BlobNotFoundError):
        blobsync.remove(container.url + "/tmpfile")
    with pytest.raises(blobsync.UsageError, match="-r"):
        blobsync.remove(container.url + "/tmp")


def test_listing_pages_ahead_and_stopping_early_leaves_nothing_running(container: ContainerHandle,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """ls/rm/list_blobs ask for page n+1 before handing out page n; a caller that stops early drops it cleanly."""
    from blobsync.backends.azure.store import AzureContainerStore

    monkeypatch.setattr(AzureContainerStore, "page_size", 2)
    names = [f"d/{i:02d}.txt" for i in range(7)]  # 4 pages
    for name in names:
        container.client.upload_blob(name, name.encode())
    asked: list[str] = []  # the marker of every page requested
    real_list_page = AzureContainerStore.list_page

    async def recording_list_page(self: AzureContainerStore, prefix: str = "", marker: str = ""
                                  ) -> tuple[list[object], str]:
        asked.append(marker)
        return await real_list_page(self, prefix, marker)  # type: ignore[return-value]

    monkeypatch.setattr(AzureContainerStore, "list_page", recording_list_page)

    async def first_three() -> tuple[list[str], int, set[asyncio.Task[object]]]:
        got: list[str] = []
        requested = 0
        async for props in blobsync.aio.list_blobs(container.url + "/d"):
            got.append(props.name)
            if len(got) == 3:  # the first blob of page 2: page 3 has been asked for already
                requested = len(asked)
                break
        await asyncio.sleep(0.2)  # the abandoned generator's clean-up runs
        return got, requested, {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    got, requested, left = asyncio.run(first_three())
    assert got == names[:3] and requested == 3 and not left
    monkeypatch.setattr(AzureContainerStore, "list_page", real_list_page)
    assert [p.name for p in blobsync.list_blobs(container.url + "/d")] == names
    report = blobsync.remove(container.url + "/d", recursive=True)
    assert report.files_deleted == 7 and container.blob_names() == []


def test_a_module_call_opens_a_client_of_its_own_and_closes_it(container: ContainerHandle, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """blobsync.copy is Client.copy on a Client opened for the one call (issue 49, point 3): the call's Progress
    sees its bytes on the wire, its journal is the config's, and the Client is closed when the call returns."""
    from blobsync.client import AsyncClient

    opened: list[AsyncClient] = []
    real = AsyncClient.copy

    async def spy(self: AsyncClient, *args: object, **kwargs: object) -> blobsync.Report:
        opened.append(self)
        return await real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(AsyncClient, "copy", spy)
    data = random_file(tmp_path / "one.bin", 3 * MiB + 7, seed=49)
    progress = blobsync.Progress()
    report = blobsync.copy(tmp_path / "one.bin", container.url + "/one.bin", _config(tmp_path), progress=progress)

    assert report.ok and len(opened) == 1
    client = opened[0]
    assert client.progress is progress and progress.bytes_moving >= len(data)
    assert client._session is not None and client._session.closed
    assert (tmp_path / "j.db").exists()
    assert container.download("one.bin") == data
    with pytest.raises(TypeError):  # a wrong argument fails as a call of the function would, before any Client
        blobsync.copy(tmp_path / "one.bin", container.url + "/one.bin", bogus=1)  # type: ignore[call-arg]
    assert len(opened) == 1
