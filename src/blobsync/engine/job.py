"""Runs an upload job: enumerate the source, merge with the journal, upload files under the global budgets."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from blobsync.backends.base import ContainerStore
from blobsync.config import TransferConfig
from blobsync.engine.context import Progress
from blobsync.engine.retry import Retrier
from blobsync.engine.runner import JobRunner, WorkItem
from blobsync.engine.upload import FileUploader
from blobsync.errors import ExitCode
from blobsync.journal import JobRow, Journal
from blobsync.local.files import SkippedEntry, SourceFile, check_source, stat_file, walk
from blobsync.location import BlobLocation
from blobsync.report import FileResult, FileStatus, Report

log = logging.getLogger("blobsync")


@dataclass(frozen=True)
class UploadSpec:
    source: Path
    dest: BlobLocation
    config: TransferConfig


def blob_name_for(spec: UploadSpec, rel: str, single: bool) -> str:
    """Blob names: for one file, the URL's path (or, if it is empty or ends in '/', that plus the file name);
    for a folder, each relative path under the URL's path as a prefix."""
    path = spec.dest.path
    if single:
        return path if path and not path.endswith("/") else f"{path}{rel}"
    prefix = path if not path or path.endswith("/") else path + "/"
    return prefix + rel


def enumerate_source(spec: UploadSpec) -> tuple[list[SourceFile], list[SkippedEntry], bool]:
    check_source(spec.source, spec.config.recursive)
    if spec.source.is_dir():
        files: list[SourceFile] = []
        skipped: list[SkippedEntry] = []
        for entry in walk(spec.source, follow_symlinks=spec.config.follow_symlinks):
            (files if isinstance(entry, SourceFile) else skipped).append(entry)  # type: ignore[arg-type]
        return files, skipped, False
    identity = stat_file(spec.source)
    return [SourceFile(spec.source, spec.source.name, identity)], [], True


def _skipped_result(entry: SkippedEntry) -> FileResult:
    failed = not entry.reason.startswith("symbolic link")
    return FileResult(entry.rel, "", 0, FileStatus.FAILED if failed else FileStatus.SKIPPED, reason=entry.reason,
                      exit_code=ExitCode.PARTIAL if failed else ExitCode.OK)


class UploadJob:
    """One run of an upload job (new or resumed). Construct with its side effects; then `await run()`."""

    def __init__(
        self,
        spec: UploadSpec,
        store: ContainerStore,
        journal: Journal,
        *,
        progress: Progress | None = None,
        job: JobRow | None = None,
    ) -> None:
        self.spec = spec
        self.store = store
        self.runner = JobRunner("upload", store, journal, spec.config, progress, job)

    async def run(self) -> Report:
        spec = self.spec
        journal = self.runner.journal
        files, skipped, single = enumerate_source(spec)
        job = self.runner.open_job(str(spec.source), spec.dest.display)
        report = Report(job.id, str(spec.source), spec.dest.display, listener=self.runner.progress.finished)
        for entry in skipped:
            report.add(_skipped_result(entry))
        rows = journal.add_files(
            job.id,
            ((f.rel, blob_name_for(spec, f.rel, single), f.identity.size, f.identity.mtime_ns, f.identity.inode)
             for f in files),
        )
        if spec.config.create_container and await Retrier(self.runner.retry_policy()).call(
                self.store.create_container):
            log.info("created container %s", spec.dest.container)
        ctx = self.runner.new_context()
        uploader = FileUploader(ctx)
        items: list[WorkItem] = []
        for f in files:
            row = rows[f.rel]
            unchanged = (row.size, row.mtime_ns, row.inode) == (f.identity.size, f.identity.mtime_ns, f.identity.inode)
            if row.state == "committed" and unchanged:
                report.add(FileResult(f.rel, row.blob, f.identity.size, FileStatus.SKIPPED,
                                      reason="already uploaded by this job"))
                continue
            items.append(WorkItem(row, f.identity.size, functools.partial(uploader.upload, row, f.path)))
        await self.runner.run(ctx, report, items)
        return report
