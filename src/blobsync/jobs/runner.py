"""What every job shares: its life in the journal, the file pool, and the one place a file's outcome is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from blobsync.backends.base import Store
from blobsync.config import Overwrite
from blobsync.engine.context import EngineContext, shared_tuning
from blobsync.engine.controls import follow_cap
from blobsync.engine.tasks import cancel_all, gather_or_cancel
from blobsync.errors import BlobsyncError, ExitCode, Scope, UnsafeNameError, UsageError
from blobsync.filters import Filters
from blobsync.jobs.ops import FileOp, Performer
from blobsync.journal import FileRow, FileState, JobKind, JobRow, JobState
from blobsync.journal.index import Entry
from blobsync.local.folding import NameClaims
from blobsync.local.target import safe_join
from blobsync.redact import redact
from blobsync.report import FileResult, FileStatus, Report

log = logging.getLogger("blobsync")

FIRST_BATCH = 64  # files journaled before the first request: few, so that the first request leaves early
BATCH = 2000  # files journaled per transaction after that

_T = TypeVar("_T")

# The journal jobs a call started, for whoever set a list here in its task (a Client's background call): what
# it names to resume when it is dropped before the end.
JOBS_STARTED: ContextVar[list[str] | None] = ContextVar("blobsync_jobs_started", default=None)


def batches(items: Iterator[_T]) -> Iterator[list[_T]]:
    """`items` in lists to journal: FIRST_BATCH, then BATCH at a time (journaling 2,000 files before the first
    request held it back ~20 ms)."""
    size = FIRST_BATCH
    while batch := list(itertools.islice(items, size)):
        yield batch
        size = BATCH


@dataclass(frozen=True)
class WorkItem:
    """One file to transfer: its journal row and its operation (which the job's Performer, or a cluster, runs)."""

    row: FileRow
    op: FileOp

    @property
    def size(self) -> int:
        return self.op.size


Settle = Callable[[Report, FileRow | None, FileResult], None]


class RemoteRunner(Protocol):
    """Runs a job's files elsewhere (cluster/client.py on Dask): the JobRunner hands its items over, and each
    file's outcome comes back through `settle`."""

    async def run(self, ctx: EngineContext, job_id: str, local_root: Path, report: Report,
                  items: Iterable[WorkItem], totals: tuple[int, int], settle: Settle, base: Path) -> None: ...


# The journal state a file's outcome leaves it in.
_STATE = {FileStatus.TRANSFERRED: FileState.COMMITTED, FileStatus.SKIPPED: FileState.SKIPPED,
          FileStatus.FAILED: FileState.FAILED, FileStatus.DELETED: FileState.DELETED}


class JobRunner:
    """Runs the files of one job (new or resumed) under the context's budgets, recording the job's state. It is
    the only writer of a file's outcome, in the journal and in the report: per-file code returns a FileResult
    (what it journals itself is its plan: nonce, block size and the blocks acknowledged, which must be durable
    before the first part leaves)."""

    def __init__(self, kind: JobKind, ctx: EngineContext, job: JobRow | None = None,
                 extra_options: Mapping[str, object] | None = None, cluster: RemoteRunner | None = None) -> None:
        if ctx.config.overwrite is Overwrite.PROMPT and ctx.overwrite_prompt is None:
            raise UsageError("--overwrite prompt needs someone to answer: pass confirm_overwrite= (library) or "
                             "run in a terminal; otherwise use true, false or ifSourceNewer")
        self.kind = kind
        self.ctx = ctx
        self.extra_options = dict(extra_options or {})  # kept with the job beside the config (cp's filters)
        self.journal = ctx.journal
        self.config = ctx.config
        self.progress = ctx.progress
        # One request path for the whole job: listings, container creation, transfers and deletes share its
        # limit and its retry count.
        self.requests = ctx.requests
        self.job = job
        self.cluster = cluster  # runs the files on other machines instead of the local pool
        self.perform = Performer(ctx, Path())  # the job sets the folder its operations' paths are under

    def performing(self, root: Path, source: Store | None = None, base: Path | None = None) -> Performer:
        """The job's operations run under `root` (a copy's: reading `source`); downloads follow no link below
        `base` (default: `root`), the folder the user named."""
        self.perform = Performer(self.ctx, root, source, base)
        return self.perform

    def open_job(self, source: str, dest: str) -> JobRow:
        """Resume the unfinished job for (source, dest) if there is one, else start a new one."""
        job = self.job or self.journal.find_unfinished_job(self.kind, source, dest)
        if job is not None and self.job is None and any(
                job.options.get(k) != v for k, v in self.extra_options.items()):
            job = None  # the same folders with other filters is another job
        fresh = job is None
        if job is None:
            job = self.journal.create_job(self.kind, source, dest,
                                          {**self.config.journal_options(), **self.extra_options})
        else:
            self.journal.claim_job(job)
        self.job = job
        self.progress.job_id = job.id
        started = JOBS_STARTED.get()
        if started is not None:
            started.append(job.id)
        log.info("job %s (%s, %s): %s -> %s", job.id, self.kind, "new" if fresh else "resumed",
                 source, dest)
        return job

    async def run(self, report: Report, items: Iterable[WorkItem], totals: tuple[int, int] | None = None) -> None:
        """Transfer every item, at most `concurrency` files at once; record the job's outcome.

        `items` may be a lazy iterator (a sync of millions of files builds them batch by batch); then `totals`
        (files, bytes) gives the progress display its totals up front."""
        assert self.job is not None
        if totals is None:
            items = list(items)
            for item in items:
                self.progress.queued(item.row.rel, item.row.blob, item.size)
            files = len(items)
        else:
            files, nbytes = totals
            self.progress.files_total += files
            self.progress.bytes_total += nbytes
        try:
            if self.cluster is not None:
                await self.cluster.run(self.ctx, self.job.id, self.perform.root, report, items,
                                       totals or (files, self.progress.bytes_total), self.settle, self.perform.base)
                self.tally(report)
            else:
                await self._pool(report, items, files, announce=totals is not None)
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.journal.set_job_state(self.job.id, JobState.INTERRUPTED)
            raise
        except BaseException as exc:
            self.journal.set_job_state(self.job.id, JobState.FAILED)
            if isinstance(exc, BlobsyncError):  # the caller learns which job to resume, and how far it got
                exc.job_id = exc.job_id or self.job.id
                exc.report = exc.report if exc.report is not None else report
            raise
        finally:
            report.duration = time.monotonic() - report.started
        self.journal.set_job_state(self.job.id, JobState.DONE if report.ok else JobState.FAILED)

    async def _pool(self, report: Report, items: Iterable[WorkItem], count: int, *, announce: bool) -> None:
        queue: Iterator[WorkItem] = iter(items)

        async def worker() -> None:
            for item in queue:
                if announce:  # counted in the totals already; subscribers hear of it as it starts
                    self.progress.queued(item.row.rel, item.row.blob, item.size, counted=True)
                self.settle(report, item.row, await self._one(item))

        ctx = self.ctx
        helpers = []
        if ctx.bandwidth is not None and self.job is not None:
            helpers.append(asyncio.create_task(follow_cap(self.journal, self.job.id, ctx.bandwidth)))
        async with contextlib.AsyncExitStack() as stack:
            # --concurrency auto: this job joins the limiter's one tuner (shared with a Client's other calls)
            tuning = ctx.tuning or shared_tuning(ctx.limiter)
            tuner = await stack.enter_async_context(tuning.joined(self.progress)) if self.config.auto_concurrency \
                else None
            tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(self.config.max_concurrency, count)))]
            try:
                await gather_or_cancel(tasks)
            except BaseException:
                await cancel_all(tasks)
                raise
            finally:
                await cancel_all(helpers)
                self.tally(report)
                report.concurrency_auto = tuner is not None
                report.concurrency = tuner.settled if tuner is not None else ctx.limiter.target
                report.concurrency_peak = tuner.peak if tuner is not None else ctx.limiter.maximum
                self.journal.flush()

    def settle(self, report: Report, row: FileRow | None, result: FileResult) -> None:
        """Record a file's outcome: its row's final state in the journal (None: a file this run leaves as the
        journal has it, or a dry run's), and its entry and byte counts in the report."""
        report.add(result)
        if row is None:
            return
        failed_or_skipped = result.status in (FileStatus.FAILED, FileStatus.SKIPPED)
        self.journal.finish_file(row.id, _STATE[result.status],
                                 md5_hex=result.content_md5.hex() if result.content_md5 else None,
                                 etag=result.etag, error=redact(result.reason) if failed_or_skipped else None,
                                 bytes_sent=result.bytes_sent)
        if result.status is FileStatus.TRANSFERRED:
            report.bytes_sent += result.bytes_sent
            report.bytes_reused += result.size - result.bytes_sent
            report.bytes_delta += result.bytes_delta
            report.bytes_copied += result.bytes_copied

    def claimed(self, report: Report, row: FileRow, e: Entry, root: Path, claims: NameClaims) -> bool:
        """Whether a download may write its local name (else its failure is settled here: an unsafe name, or one
        that collides with another's on this file system)."""
        try:
            safe_join(root, e.rel)
            other = claims.claim(e.rel)
            if other is not None:
                raise UnsafeNameError(claims.message(e.rel, other))
        except UnsafeNameError as exc:
            self.settle(report, row, FileResult(e.rel, e.name or e.rel, e.size, FileStatus.FAILED, reason=str(exc),
                                                exit_code=ExitCode.PARTIAL))
            return False
        return True

    def settle_missing(self, report: Report, filters: Filters) -> None:
        """Each path --list-of-files names that nothing under the source matched: a failure of its own."""
        for path in filters.unmatched():
            self.settle(report, None, FileResult(path, "", 0, FileStatus.FAILED, exit_code=ExitCode.PARTIAL,
                                                 reason="named in --list-of-files, but not found under the source"))

    def tally(self, report: Report) -> None:
        """The request path's counters into the report (again after work outside the transfers: deletes)."""
        limiter = self.requests.limiter
        report.retries = self.requests.retrier.retries + sum(s.retries for s in report.shards)
        report.throttled = limiter.throttled
        if limiter.cuts:
            report.lowest_concurrency = limiter.lowest

    async def _one(self, item: WorkItem) -> FileResult:
        row = item.row
        try:
            result = await self.perform(row, item.op)
            log.debug("%s: %s (%d bytes sent)", row.rel, result.status.value, result.bytes_sent)
            return result
        except BlobsyncError as exc:
            if exc.scope is not Scope.FILE:
                raise  # no other file escapes it: the job stops (resumable)
            message = redact(str(exc))
            log.warning("%s: %s", row.rel, message)
            code = exc.exit_code if exc.exit_code != ExitCode.OK else ExitCode.PARTIAL
            return FileResult(row.rel, row.blob, item.size, FileStatus.FAILED, reason=message, exit_code=code)
