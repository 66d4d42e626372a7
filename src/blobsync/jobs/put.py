"""A put: data a library call holds (bytes, a file object) written as one blob through the journal."""

from __future__ import annotations

import uuid

from blobsync.engine.context import EngineContext
from blobsync.errors import ConflictError, TransferFailedError
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import JobRunner, WorkItem
from blobsync.jobs.spec import PutSpec
from blobsync.journal import JobKind, JobState
from blobsync.journal.states import MEMORY_SOURCE
from blobsync.report import FileResult, FileStatus, Report


class PutJob:
    """One put; `run()` returns its report, whose one written entry is the record of what landed."""

    def __init__(self, spec: PutSpec, ctx: EngineContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.runner = JobRunner(JobKind.UPLOAD, ctx)

    async def run(self) -> Report:
        src, loc, ctx = self.spec.source, self.spec.dest, self.ctx
        # A file on disk resumes like a path (its staged blocks are kept); other data starts a job of its own.
        key = getattr(src, "resume_key", None) or f"{MEMORY_SOURCE}{uuid.uuid4().hex}"
        job = self.runner.open_job(key, loc.display)
        size = src.opened.size
        row = ctx.journal.add_files(job.id, [(loc.path, loc.path, size, src.opened.mtime_ns, 0)])[loc.path]
        report = Report(job.id, "<memory>", loc.display, kind="upload", listener=ctx.progress.finished)
        op = FileOp(OpKind.PUT, loc.path, loc.path, size, src.opened.mtime_ns, data=src)
        try:
            await self.runner.run(report, [WorkItem(row, op)])
        finally:
            if key.startswith(MEMORY_SOURCE) and not report.written:  # the bytes die with this call: no resume
                ctx.journal.set_job_state(job.id, JobState.ABANDONED)
        return report


def landed(report: Report) -> FileResult:
    """The record of the one blob a put wrote; raises if it failed or (overwrite false) was not written."""
    if report.failures or not (report.written or report.skipped_notes):
        raise TransferFailedError(report)
    if not report.written:  # overwrite false (or ifSourceNewer) and the blob is there
        skipped = report.skipped_notes[0]
        raise ConflictError(f"blob {skipped.blob!r} exists: not overwritten ({skipped.reason})", status=409,
                            code="BlobAlreadyExists")
    result = report.written[0]
    assert result.status is FileStatus.TRANSFERRED
    return result
