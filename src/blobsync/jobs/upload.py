"""An upload job: enumerate the source, merge with the journal, upload files under the global budgets."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from blobsync.engine.context import EngineContext
from blobsync.engine.enumerate import index_in_thread
from blobsync.errors import ExitCode
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import JobRunner, RemoteRunner, WorkItem, batches
from blobsync.jobs.spec import UploadSpec
from blobsync.journal import FileState, JobKind, JobRow
from blobsync.journal.index import Entry, SyncIndex
from blobsync.local.files import SkippedEntry, SourceFile, blob_rel, check_source, stat_file, walk, warm_if_cold
from blobsync.naming import upload_name
from blobsync.report import DRY_RUN, Action, FileResult, FileStatus, Report

log = logging.getLogger("blobsync")


def _skipped_result(entry: SkippedEntry) -> FileResult:
    failed = entry.failed
    return FileResult(entry.rel, "", 0, FileStatus.FAILED if failed else FileStatus.SKIPPED, reason=entry.reason,
                      exit_code=ExitCode.PARTIAL if failed else ExitCode.OK)


class UploadJob:
    """One run of an upload job (new or resumed). Construct with its side effects; then `await run()`."""

    def __init__(self, spec: UploadSpec, ctx: EngineContext, *, job: JobRow | None = None,
                 on_action: Callable[[Action], None] | None = None, cluster: RemoteRunner | None = None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.store = ctx.store
        self.on_action = on_action or (lambda action: None)
        self.runner = JobRunner(JobKind.UPLOAD, ctx, job, extra_options={"filters": spec.filters.text or None},
                                cluster=cluster)

    async def run(self) -> Report:
        spec = self.spec
        check_source(spec.source, self.ctx.config.recursive)
        if not spec.source.is_dir():
            identity = stat_file(spec.source)
            entry = Entry(spec.source.name, identity.size, identity.mtime_ns, inode=identity.inode)
            return await self._run((), lambda report: self._items([entry], report, single=True), None)
        # A folder is walked into a scratch index first (in a worker thread): the totals are known before
        # the first byte moves, and however many files there are, only a batch of them is in memory at once.
        index = SyncIndex(self.runner.journal.path.parent)
        try:
            skipped: list[SkippedEntry] = []
            await index_in_thread(index, "src", lambda: self._walk(skipped))
            return await self._run(skipped, lambda report: self._batches(index, report), index, index.totals("src"))
        finally:
            index.close()

    async def _run(self, skipped: Sequence[SkippedEntry], work: Callable[[Report], Iterator[WorkItem]],
                   index: SyncIndex | None, totals: tuple[int, int] | None = None) -> Report:
        spec = self.spec
        if spec.dry_run:
            return self._dry_run(index)
        job = self.runner.open_job(str(spec.source), spec.dest.display)
        report = Report(job.id, str(spec.source), spec.dest.display, listener=self.runner.progress.finished)
        for item in skipped:
            self.runner.settle(report, None, _skipped_result(item))
        self.runner.settle_missing(report, spec.filters)
        if self.ctx.config.create_container and await self.runner.requests(self.store.create_container):
            log.info("created container %s", spec.dest.container)
        self.runner.performing(spec.source if spec.source.is_dir() else spec.source.parent)
        await self.runner.run(report, work(report), totals)
        return report

    def _dry_run(self, index: SyncIndex | None) -> Report:
        """cp --dry-run: each file that would go up, and its blob name; nothing is sent or journaled."""
        spec = self.spec
        report = Report(DRY_RUN, str(spec.source), spec.dest.display)
        self.runner.settle_missing(report, spec.filters)
        entries = index.entries("src") if index is not None else [
            Entry(spec.source.name, stat_file(spec.source).size, 0)]
        for e in entries:
            name = upload_name(spec.dest.path, blob_rel(e.rel), single=index is None)
            self.on_action(Action("upload", e.rel, f"to {name}", e.size))
            self.runner.settle(report, None, FileResult(e.rel, name, e.size, FileStatus.PLANNED,
                                                        reason=f"would upload to {name}"))
        return report

    def _walk(self, skipped: list[SkippedEntry]) -> Iterator[Entry]:
        """The folder's files the filters take, as index entries (runs in a worker thread); skipped ones are set
        aside. Folders nothing could match in are not even listed."""
        filters = self.spec.filters
        for item in walk(self.spec.source, follow_symlinks=self.ctx.config.follow_symlinks, enters=filters.enters):
            if isinstance(item, SkippedEntry):
                if filters.matches(item.rel):
                    skipped.append(item)
                continue
            f: SourceFile = item
            if filters.matches(f.rel, f.identity.mtime_ns / 1e9):
                yield Entry(f.rel, f.identity.size, f.identity.mtime_ns, inode=f.identity.inode)

    def _batches(self, index: SyncIndex, report: Report) -> Iterator[WorkItem]:
        for batch in batches(index.entries("src")):
            warm_if_cold([(self.spec.source / e.rel, e.size) for e in batch], self.ctx.io_pool.submit)
            yield from self._items(batch, report, single=False)

    def _items(self, entries: list[Entry], report: Report, *, single: bool) -> Iterator[WorkItem]:
        """Journal rows for these files (a resumed job's own included), and work for those not done yet."""
        spec = self.spec
        assert self.runner.job is not None
        rows = self.runner.journal.add_files(self.runner.job.id, (
            (e.rel, upload_name(spec.dest.path, blob_rel(e.rel), single=single), e.size, e.mtime_ns, e.inode)
            for e in entries))
        for e in entries:
            row = rows[e.rel]
            same = (row.size, row.mtime_ns, row.inode) == (e.size, e.mtime_ns, e.inode)
            if row.state is FileState.COMMITTED and same:
                self.runner.settle(report, None, FileResult(e.rel, row.blob, e.size, FileStatus.SKIPPED,
                                                            reason="already uploaded by this job"))
                continue
            rel, walked = (spec.source.name, 0) if single else (e.rel, e.inode)
            yield WorkItem(row, FileOp(OpKind.UPLOAD, rel, row.blob, e.size, e.mtime_ns, inode=walked))
