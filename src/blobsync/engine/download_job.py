"""Runs a download job: list the blobs (or one blob), merge with the journal, download under the budgets."""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass
from pathlib import Path

from blobsync.backends.base import BlobProperties, ContainerStore
from blobsync.config import TransferConfig
from blobsync.engine.context import Progress
from blobsync.engine.download import FileDownloader
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.engine.runner import JobRunner, WorkItem
from blobsync.errors import BlobNotFoundError, ExitCode, UnsafeNameError, UsageError
from blobsync.journal import JobRow, Journal
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

    async def _enumerate(self) -> tuple[Path, list[tuple[str, BlobProperties]]]:
        """The local root and (relative name, blob) pairs to fetch."""
        spec = self.spec
        request = self.runner.requests
        name = spec.source.path
        if spec.config.recursive:
            prefix = name if not name or name.endswith("/") else name + "/"
            if spec.dest.exists() and not spec.dest.is_dir():
                raise UsageError(f"destination {str(spec.dest)!r} is a file: -r needs a folder")

            blobs = [b async for b in self.store.list_blobs(prefix, request=request)]
            return spec.dest, [(b.name[len(prefix):], b) for b in blobs if not b.name.endswith("/")]
        if not name or name.endswith("/"):
            raise UsageError(f"{spec.source.display!r} names no blob: add the blob's name, or pass -r to download "
                             "everything under a prefix")
        props = await request(lambda: self.store.get_properties(name))
        if props is None:
            raise BlobNotFoundError(f"blob {name!r} not found in container {spec.source.container!r}",
                                    hint="check the URL (names are case-sensitive)")
        base = posixpath.basename(name)
        if spec.dest.is_dir() or spec.dest_is_folder:
            return spec.dest, [(base, props)]
        return spec.dest.parent, [(spec.dest.name, props)]

    async def run(self) -> Report:
        spec = self.spec
        journal = self.runner.journal
        root, blobs = await self._enumerate()
        job = self.runner.open_job(spec.source.display, str(spec.dest))
        report = Report(job.id, spec.source.display, str(spec.dest), kind="download",
                        listener=self.runner.progress.finished)
        rows = journal.add_files(
            job.id, ((rel, b.name, b.size, destination_mtime_ns(b), 0) for rel, b in blobs)
        )
        ctx = self.runner.new_context()
        downloader = FileDownloader(ctx)
        items: list[WorkItem] = []
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
            items.append(WorkItem(row, props.size, functools.partial(downloader.download, row, props, target)))
        await self.runner.run(ctx, report, items)
        return report
