"""Runs an upload job: enumerate the source, merge with the journal, upload files under the global budgets."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from blobsync.backends.base import ContainerStore
from blobsync.config import TransferConfig
from blobsync.engine.budget import MemoryBudget, RequestLimiter
from blobsync.engine.context import EngineContext, Progress
from blobsync.engine.retry import Retrier, RetryPolicy
from blobsync.engine.upload import FileUploader
from blobsync.errors import (
    AuthError,
    BlobsyncError,
    ContainerNotFoundError,
    ExitCode,
    IntegrityError,
    TransientError,
)
from blobsync.journal import FileRow, JobRow, Journal
from blobsync.local.files import SkippedEntry, SourceFile, check_source, stat_file, walk
from blobsync.location import BlobLocation
from blobsync.redact import redact
from blobsync.report import FileResult, FileStatus, Report

log = logging.getLogger("blobsync")

# Errors that no other file can escape either: stop the job (it stays resumable).
FATAL = (AuthError, ContainerNotFoundError, TransientError)


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
        self.journal = journal
        self.progress = progress or Progress()
        self.job = job
        self.report: Report | None = None

    def _find_or_create_job(self) -> JobRow:
        source = str(self.spec.source)
        dest = self.spec.dest.display
        job = self.job or self.journal.find_unfinished_job("upload", source, dest)
        if job is None:
            job = self.journal.create_job("upload", source, dest, self.spec.config.journal_options())
        else:
            self.journal.claim_job(job)
        self.job = job
        self.progress.job_id = job.id
        return job

    async def run(self) -> Report:
        spec = self.spec
        cfg = spec.config
        files, skipped, single = enumerate_source(spec)
        job = self._find_or_create_job()
        report = Report(job.id, str(spec.source), spec.dest.display)
        self.report = report
        for entry in skipped:
            report.add(_skipped_result(entry))
        rows = self.journal.add_files(
            job.id,
            ((f.rel, blob_name_for(spec, f.rel, single), f.identity.size, f.identity.mtime_ns, f.identity.inode)
             for f in files),
        )
        progress = self.progress
        work: list[tuple[FileRow, SourceFile]] = []
        for f in files:
            row = rows[f.rel]
            unchanged = (row.size, row.mtime_ns, row.inode) == (f.identity.size, f.identity.mtime_ns, f.identity.inode)
            if row.state == "committed" and unchanged:
                report.add(FileResult(f.rel, row.blob, f.identity.size, FileStatus.SKIPPED,
                                      reason="already uploaded by this job"))
                continue
            work.append((row, f))
        progress.files_total = len(work)
        progress.bytes_total = sum(f.identity.size for _, f in work)

        if cfg.create_container and await Retrier(self._retry_policy()).call(self.store.create_container):
            log.info("created container %s", spec.dest.container)

        try:
            await self._upload_all(work, report)
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.journal.set_job_state(job.id, "interrupted")
            raise
        except BaseException:
            self.journal.set_job_state(job.id, "failed")
            raise
        finally:
            report.duration = time.monotonic() - report.started
        self.journal.set_job_state(job.id, "done" if report.ok else "failed")
        return report

    def _retry_policy(self) -> RetryPolicy:
        cfg = self.spec.config
        return RetryPolicy(max_attempts=cfg.max_retries + 1, deadline=cfg.retry_deadline)

    async def _upload_all(self, work: list[tuple[FileRow, SourceFile]], report: Report) -> None:
        cfg = self.spec.config
        retrier = Retrier(self._retry_policy(), on_retry=self._on_retry)
        io_pool = ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) + 2), thread_name_prefix="bs-io")
        hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bs-md5")
        ctx = EngineContext(self.store, self.journal, cfg, MemoryBudget(cfg.memory),
                            RequestLimiter(cfg.concurrency), retrier, io_pool, hash_pool, self.progress)
        uploader = FileUploader(ctx)
        queue: Iterable[tuple[FileRow, SourceFile]] = iter(work)
        workers = max(1, min(cfg.concurrency, len(work)))

        async def worker() -> None:
            for row, f in queue:
                result = await self._upload_one(uploader, row, f)
                report.add(result)
                if result.status is FileStatus.FAILED:
                    self.progress.files_failed += 1
                elif result.status is FileStatus.SKIPPED:
                    self.progress.files_skipped += 1
                else:
                    self.progress.files_done += 1
                    report.bytes_sent += result.bytes_sent
                    report.bytes_reused += result.size - result.bytes_sent

        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
            for task in done:
                task.result()
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise
        finally:
            report.retries += retrier.retries
            self.journal.flush()
            io_pool.shutdown(wait=True)
            hash_pool.shutdown(wait=True)

    async def _upload_one(self, uploader: FileUploader, row: FileRow, f: SourceFile) -> FileResult:
        try:
            return await uploader.upload(row, f.path)
        except FATAL:
            raise
        except BlobsyncError as exc:
            code = ExitCode.INTEGRITY if isinstance(exc, IntegrityError) else exc.exit_code
            if code == ExitCode.USAGE:
                raise
            message = redact(str(exc))
            self.journal.finish_file(row.id, "failed", error=message)
            log.warning("%s: %s", f.rel, message)
            return FileResult(f.rel, row.blob, f.identity.size, FileStatus.FAILED, reason=message,
                              exit_code=code if code != ExitCode.OK else ExitCode.PARTIAL)

    def _on_retry(self, error: BaseException, delay: float) -> None:
        log.info("retrying in %.1fs after: %s", delay, redact(str(error)))

