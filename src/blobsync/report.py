"""What a transfer did: per-file results and the totals a user or a pipeline acts on."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import Enum

from blobsync.errors import ExitCode


class FileStatus(Enum):
    TRANSFERRED = "transferred"
    SKIPPED = "skipped"
    FAILED = "failed"
    DELETED = "deleted"  # sync: removed at the destination because the source no longer has it
    PLANNED = "planned"  # a dry run: would be transferred (nothing moved)


@dataclass(frozen=True)
class Action:
    """One thing a job does (or, in a dry run, would do), with its reason."""

    kind: str  # upload | download | delete
    path: str  # relative path
    reason: str
    size: int = 0


@dataclass(frozen=True)
class FileResult:
    rel: str
    blob: str
    size: int
    status: FileStatus
    bytes_sent: int = 0
    reason: str = ""  # why skipped or failed; "resumed" notes for uploads
    exit_code: ExitCode = ExitCode.OK
    bytes_delta: int = 0  # unchanged blocks a delta upload named from the committed version, not sent
    etag: str | None = None  # transferred: the version written (upload) or read (download)
    content_md5: bytes | None = None  # transferred: the MD5 of the bytes, as stored in the blob's Content-MD5
    url: str | None = None  # transferred: the blob's URL, without any SAS
    version_id: str | None = None  # uploads where the account keeps versions
    bytes_copied: int = 0  # unchanged blocks an incremental write had the service stage from an earlier blob


@dataclass(frozen=True)
class ShardRow:
    """What one task of a job run on a cluster did (a shard of files, or a range of one huge file)."""

    label: str
    worker: str
    files: int
    bytes: int
    duration: float
    retries: int


WRITTEN_KEPT = 100_000  # transferred files a Report lists in full (~0.3 KiB each)
NO_JOB = "-"  # the report's job_id when no job was opened (a no-op sync, rm)
DRY_RUN = "dry-run"  # ... and when nothing was to be changed


@dataclass
class Report:
    """Totals of one run of a job. Failures are kept in full; what was written (`written`: URL, ETag, MD5, size,
    version) for the first WRITTEN_KEPT files, then counted only (`written_complete` turns False): a subscriber's
    on_done sees every one, for a registry of a job larger than that."""

    job_id: str
    source: str
    dest: str
    kind: str = "upload"  # or "download"
    files_transferred: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    files_deleted: int = 0
    files_planned: int = 0  # a dry run: what would be transferred (files_transferred stays 0)
    bytes_planned: int = 0
    files_in_sync: int = 0  # sync: source files the destination already had
    files_held: int = 0  # sync --watch: source files still changing, left for a later round
    deletes_refused: str = ""  # why a sync deleted nothing although it had candidates
    notes: list[str] = field(default_factory=list)  # said once at the end (a copy that went through this machine)
    bytes_transferred: int = 0  # size of the files transferred
    bytes_sent: int = 0  # bytes that went over the wire in this run (blocks, bodies)
    bytes_reused: int = 0  # bytes found already on the service (resume, or unchanged blocks of a delta)
    bytes_delta: int = 0  # of bytes_reused: unchanged blocks reused by delta uploads
    bytes_copied: int = 0  # of bytes_reused: unchanged blocks staged by the service from an earlier blob
    retries: int = 0
    throttled: int = 0  # throttling answers (429, 503, 500 OperationTimedOut)
    lowest_concurrency: int | None = None  # how far adaptive concurrency went down, if it did
    concurrency: int = 0  # requests in flight at the end: with --concurrency auto, the level it settled on
    concurrency_auto: bool = False
    concurrency_peak: int = 0  # the highest level tried
    started: float = field(default_factory=time.monotonic)
    duration: float = 0.0
    failures: list[FileResult] = field(default_factory=list)
    written: list[FileResult] = field(default_factory=list)
    written_complete: bool = True
    skipped_notes: list[FileResult] = field(default_factory=list)
    shards: list[ShardRow] = field(default_factory=list)  # a job run on a cluster: one row per task
    # Sees every result as it is added: the live progress and the subscribers hang off it.
    listener: Callable[[FileResult], None] | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        # The lists by their length: a Report of 100,000 files would print (and cost) megabytes. asyncio formats
        # the repr of a job's task, result and all, as its run ends (Runner.run's signal check).
        shown = []
        for f in fields(self):
            if not f.repr:
                continue
            value = getattr(self, f.name)
            shown.append(f"{f.name}=[{len(value)} entries]" if isinstance(value, list) and value else
                         f"{f.name}={value!r}")
        return f"Report({', '.join(shown)})"

    def add(self, result: FileResult) -> None:
        if self.listener is not None:
            self.listener(result)
        if result.status is FileStatus.DELETED:
            self.files_deleted += 1
        elif result.status is FileStatus.PLANNED:
            self.files_planned += 1
            self.bytes_planned += result.size
        elif result.status is FileStatus.TRANSFERRED:
            self.files_transferred += 1
            self.bytes_transferred += result.size
            if len(self.written) < WRITTEN_KEPT:
                self.written.append(result)
            else:
                self.written_complete = False
        elif result.status is FileStatus.SKIPPED:
            self.files_skipped += 1
            if len(self.skipped_notes) < 1000:
                self.skipped_notes.append(result)
        else:
            self.files_failed += 1
            self.failures.append(result)

    @property
    def ok(self) -> bool:
        return self.files_failed == 0

    @property
    def exit_code(self) -> ExitCode:
        if not self.failures:
            return ExitCode.OK
        codes = {f.exit_code for f in self.failures}
        for code in (ExitCode.INTEGRITY, ExitCode.AUTH):
            if code in codes:
                return code
        return ExitCode.PARTIAL


def blob_url(container_url: str, blob: str) -> str:
    """A blob's URL for a report: the container's (which holds no SAS) and the name, percent-encoded."""
    from urllib.parse import quote

    return f"{container_url.rstrip('/')}/{quote(blob, safe='/~')}"
