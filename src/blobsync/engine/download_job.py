"""Runs a download job: list the blobs (or one blob), merge with the journal, download under the budgets."""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from blobsync.backends.base import BlobProperties, ContainerStore
from blobsync.config import TransferConfig
from blobsync.engine.context import EngineContext, Progress
from blobsync.engine.download import FileDownloader
from blobsync.engine.listing import as_properties, remote_entry
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.engine.runner import JobRunner, WorkItem, batches
from blobsync.errors import BlobNotFoundError, ExitCode, UnsafeNameError, UsageError
from blobsync.journal import JobRow, Journal
from blobsync.journal.index import Entry, SyncIndex
from blobsync.local.target import safe_join
from blobsync.location import BlobLocation
from blobsync.report import FileResult, FileStatus, Report


@dataclass(frozen=True)
class DownloadSpec:
    source: BlobLocation
    dest: Path
    config: TransferConfig
    dest_is_folder: bool = False  # the user wrote a trailing '/': a single blob keeps its own name inside

class DownloadJob:
    """One run of a download job (new or resumed). Construct with its side effects; then `await run()`."""

    def __init__(self, spec: DownloadSpec, store: ContainerStore, journal: Journal, *,
                 progress: Progress | None = None, job: JobRow | None = None) -> None:
        self.spec = spec
        self.store = store
        self.runner = JobRunner("download", store, journal, spec.config, progress, job)

    def _prefix(self) -> str:
        name = self.spec.source.path
        return name if not name or name.endswith("/") else name + "/"

    async def _one_blob(self) -> tuple[Path, str, BlobProperties]:
        """The local folder, the local name and the blob of a download of one blob."""
        spec = self.spec
        name = spec.source.path
        if not name or name.endswith("/"):
            raise UsageError(f"{spec.source.display!r} names no blob: add the blob's name, or pass -r to download "
                             "everything under a prefix")
        props = await self.runner.requests(lambda: self.store.get_properties(name))
        if props is None:
            raise BlobNotFoundError(f"blob {name!r} not found in container {spec.source.container!r}",
                                    hint="check the URL (names are case-sensitive)")
        base = posixpath.basename(name)
        if spec.dest.is_dir() or spec.dest_is_folder:
            return spec.dest, base, props
        return spec.dest.parent, spec.dest.name, props

    async def _list_into(self, index: SyncIndex) -> None:
        """Every blob under the prefix into the scratch index, page by page: memory stays flat however many."""
        prefix = self._prefix()
        batch: list[Entry] = []
        async for props in self.store.list_blobs(prefix, request=self.runner.requests):
            if props.name.endswith("/"):
                continue  # folder markers of hierarchical tools
            batch.append(remote_entry(prefix, props))
            if len(batch) >= 1000:
                index.add("src", batch)
                batch = []
        index.add("src", batch)

    async def run(self) -> Report:
        spec = self.spec
        if not spec.config.recursive:
            root, rel, props = await self._one_blob()
            return await self._run(
                lambda ctx, report: self._items(root, [(rel, props)], report, FileDownloader(ctx)), None)
        if spec.dest.exists() and not spec.dest.is_dir():
            raise UsageError(f"destination {str(spec.dest)!r} is a file: -r needs a folder")
        index = SyncIndex(self.runner.journal.path.parent)
        try:
            await self._list_into(index)

            def work(ctx: EngineContext, report: Report) -> Iterator[WorkItem]:
                downloader = FileDownloader(ctx)
                for batch in batches(index.entries("src")):
                    yield from self._items(spec.dest, [(e.rel, as_properties(e)) for e in batch], report, downloader)

            return await self._run(work, index.totals("src"))
        finally:
            index.close()

    async def _run(self, work: Callable[[EngineContext, Report], Iterable[WorkItem]],
                   totals: tuple[int, int] | None) -> Report:
        spec = self.spec
        job = self.runner.open_job(spec.source.display, str(spec.dest))
        report = Report(job.id, spec.source.display, str(spec.dest), kind="download",
                        listener=self.runner.progress.finished)
        ctx = self.runner.new_context()
        await self.runner.run(ctx, report, work(ctx, report), totals)
        return report

    def _items(self, root: Path, blobs: list[tuple[str, BlobProperties]], report: Report,
               downloader: FileDownloader) -> Iterator[WorkItem]:
        """Journal rows for these blobs (a resumed job's own included), and work for those not done yet."""
        journal = self.runner.journal
        assert self.runner.job is not None
        rows = journal.add_files(
            self.runner.job.id, ((rel, b.name, b.size, destination_mtime_ns(b), 0) for rel, b in blobs))
        for rel, props in blobs:
            row = rows[rel]
            try:
                target = safe_join(root, rel)
            except UnsafeNameError as exc:
                journal.finish_file(row.id, "failed", error=str(exc))
                report.add(FileResult(rel, props.name, props.size, FileStatus.FAILED, reason=str(exc),
                                      exit_code=ExitCode.PARTIAL))
                continue
            if (row.state == "committed" and row.etag == props.etag and target.is_file()
                    and target.stat().st_size == props.size):
                report.add(FileResult(rel, props.name, props.size, FileStatus.SKIPPED,
                                      reason="already downloaded by this job"))
                continue
            yield WorkItem(row, props.size, functools.partial(downloader.download, row, props, target))
