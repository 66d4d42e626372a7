"""The work a worker does, engine-neutral (plain specs in, plain reports out): a shard of whole files, and the
range, hash and commit tasks of a file too big for one shard."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from blobsync.backends.base import Store
from blobsync.cluster.spec import FileOutcome, ShardReport, ShardSpec, WorkerJob
from blobsync.config import TransferConfig
from blobsync.engine.bandwidth import BucketState, TokenBucket
from blobsync.engine.context import EngineContext
from blobsync.engine.session import Session
from blobsync.errors import BlobsyncError, SourceChangedError
from blobsync.events import BaseSubscriber, Progress
from blobsync.jobs.ops import FileOp
from blobsync.jobs.runner import JobRunner, WorkItem
from blobsync.journal import FileState, JobKind, Journal
from blobsync.local.files import FileIdentity
from blobsync.report import FileResult, FileStatus, Report

Publish = Callable[[dict[str, Any]], None]  # sends one progress event to the client (the adapter's channel)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_config(job: WorkerJob, journal_path: Path) -> TransferConfig:
    return TransferConfig.from_journal(job.options, journal_path=journal_path, proxy=job.proxy)


class _MachineCap:
    """The bandwidth cap of this worker process's jobs: the one its client shares with every worker process of
    the machine (blobsync's own processes), else one bucket per job in this process, shared by all its tasks
    (a Dask worker runs several at once, and a task must not start with a fresh bucket's burst)."""

    def __init__(self) -> None:
        self.state: BucketState | None = None  # set by the worker process's start (processes.py)
        self._lock = threading.Lock()
        self._buckets: dict[str, TokenBucket] = {}

    def bucket(self, job: WorkerJob, config: TransferConfig) -> TokenBucket | None:
        if not config.cap_bytes:
            return None
        if self.state is not None:
            return TokenBucket(config.cap_bytes, state=self.state)
        with self._lock:
            found = self._buckets.get(job.job)
            if found is None:
                while len(self._buckets) >= 16:  # the jobs of long ago: a worker serves one job at a time
                    self._buckets.pop(next(iter(self._buckets)))
                found = self._buckets[job.job] = TokenBucket(config.cap_bytes)
            return found


    def set_share(self, job: str, rate: float) -> None:
        """This process's share of the job's cap, as the client rebalances it among the workers busy now."""
        with self._lock:
            found = self._buckets.get(job)
        if found is not None and rate > 0:
            found.set_rate(rate)

    def rate(self, job: str) -> float | None:
        with self._lock:
            found = self._buckets.get(job)
        return None if found is None else found.rate


MACHINE_CAP = _MachineCap()


class _ShardFolder:
    """This worker process's own folder for task journals: made by mkdtemp (0700, a name no other user can create
    first, never a predictable path under /tmp) when a task needs it, removed when no task of it is running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._users = 0

    @contextlib.contextmanager
    def used(self) -> Iterator[Path]:
        with self._lock:
            if self._path is None:
                self._path = Path(tempfile.mkdtemp(prefix="blobsync-shards-"))
            self._users += 1
            path = self._path
        try:
            yield path
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    with contextlib.suppress(OSError):
                        path.rmdir()
                    self._path = None


SHARD_FOLDER = _ShardFolder()


def _journal_path(folder: Path, job: WorkerJob, key: str) -> Path:
    """One task run's journal, on this worker's own disk and for this run only: a rerun (here or on another
    worker) resumes through the client's nonces, asking the store what it holds, never through a journal."""
    return folder / f"{job.job}-{key}-{os.getpid()}-{threading.get_ident()}.db"


class Relay(BaseSubscriber):
    """Progress events to the client, a few per second at most, and every file's outcome kept for the report."""

    def __init__(self, publish: Publish | None, label: str) -> None:
        self.publish = publish
        self.label = label
        self.outcomes: list[FileOutcome] = []
        self._bytes = 0
        self._last = 0.0

    def on_progress(self, rel: str, nbytes: int) -> None:
        self._bytes += nbytes
        self._tick()

    def _tick(self) -> None:
        # A few events a second at most, whatever the number of files: each costs the client a wake-up (a shard
        # of 2,000 small files sent one event per file: ~10% of the client's CPU). Outcomes come in the report.
        now = time.monotonic()
        if self.publish is not None and self._bytes and now - self._last >= 0.25:
            self._last = now
            self.publish({"shard": self.label, "bytes": self._bytes})
            self._bytes = 0

    def on_done(self, result: FileResult) -> None:
        failed = result.status is FileStatus.FAILED
        self.on_done_outcome(FileOutcome(result.rel, not failed, result.bytes_sent, result.reason,
                                         int(result.exit_code), result.status is FileStatus.SKIPPED,
                                         delta=result.bytes_delta, etag=result.etag or "",
                                         md5=result.content_md5.hex() if result.content_md5 else "",
                                         copied=result.bytes_copied))

    def on_done_outcome(self, outcome: FileOutcome) -> None:
        self.outcomes.append(outcome)
        self._tick()

    def landed(self, rel: str, idx: int, size: int, boot: str | None) -> None:
        """A split download's range is in the partial file (written; fsynced only if `boot` is None): the client
        journals it at once, so a rerun after a kill fetches only what had not landed."""
        if self.publish is not None:
            self.publish({"landed": rel, "idx": idx, "size": size, "boot": boot})

    def flush(self) -> None:
        if self.publish is not None and self._bytes:
            self.publish({"shard": self.label, "bytes": self._bytes})
            self._bytes = 0


@contextlib.asynccontextmanager
async def shard_engine(job: WorkerJob, key: str, label: str, publish: Publish | None
                       ) -> AsyncIterator[tuple[EngineContext, Relay, Store | None]]:
    """The engine for one task on this worker, with its own journal (`key` names it), a relay of its progress, and
    a copy's source store (its URL's SAS, or this machine's environment)."""
    relay = Relay(publish, label)
    with SHARD_FOLDER.used() as folder:
        path = _journal_path(folder, job, key)
        journal = Journal(path)
        try:
            config, progress = worker_config(job, path), Progress(subscribers=[relay])
            session = Session(config, os.environ, journal, wire_progress=progress, credential=job.credential,
                              home=job.url, bucket=MACHINE_CAP.bucket(job, config))
            try:
                source = session.store(job.source_url) if job.source_url else None
                yield session.context(job.url, config, progress=progress), relay, source
            finally:
                await session.close()  # closes the journal too
        finally:
            journal.close()
            for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                with contextlib.suppress(OSError):
                    leftover.unlink()


async def run_shard(spec: ShardSpec, publish: Publish | None, worker: str) -> ShardReport:
    """Transfer the shard's files with the engine, resuming what an earlier run of it (here or elsewhere) left."""
    label = f"shard-{spec.shard}"
    started = time.monotonic()
    async with shard_engine(spec.job, label, f"shard {spec.shard}", publish) as (ctx, relay, source):
        kind = JobKind.COPY if spec.job.source_url else JobKind.UPLOAD if spec.job.upload else JobKind.DOWNLOAD
        runner = JobRunner(kind, ctx)
        job = runner.open_job(spec.job.local_root, f"{ctx.store.display_url}#{spec.job.job}/{spec.shard}")
        report = Report(job.id, spec.job.local_root, ctx.store.display_url, listener=ctx.progress.finished)
        rows = ctx.journal.add_files(job.id, ((f.rel, f.blob, f.size, f.mtime_ns, 0) for f in spec.files))
        # The operations the client made, run as the plain job runs them (the same Performer).
        runner.performing(Path(spec.job.local_root), source, Path(spec.job.base or spec.job.local_root))
        await runner.run(report, [WorkItem(rows[f.rel], f) for f in spec.files
                                  if rows[f.rel].state is not FileState.COMMITTED])
        retries = ctx.requests.retrier.retries
        if kind is JobKind.UPLOAD:
            _commit_records(ctx, spec, relay.outcomes)
    relay.flush()
    return ShardReport(f"shard {spec.shard}", worker, len(spec.files), sum(f.size for f in spec.files),
                       report.bytes_sent, time.monotonic() - started, retries, relay.outcomes)


def _commit_records(ctx: EngineContext, spec: ShardSpec, outcomes: list[FileOutcome]) -> None:
    """Each upload's commit record, as this task's journal holds it, for the client's journal: what the next run's
    delta builds on, wherever it runs."""
    ctx.journal.flush()
    blobs = {f.rel: f.blob for f in spec.files}
    for outcome in outcomes:
        if outcome.ok and not outcome.skipped and outcome.rel in blobs:
            outcome.commit = ctx.journal.committed_blob(ctx.store.container_url, blobs[outcome.rel])


def check_identity(path: Path, f: FileOp) -> FileIdentity:
    """The file as planned (size, mtime and the inode walked), or SourceChangedError: no part of another version
    (or of another file swapped in under its name) may be staged."""
    try:
        ident = FileIdentity.of(os.stat(path))
    except OSError as exc:
        raise BlobsyncError(f"{path}: {exc.strerror or exc}") from exc
    if f.inode and ident.inode != f.inode:
        raise SourceChangedError(f"{path}: is another file than the one listed (replaced since the walk, or a link "
                                 "now): not uploaded; run again to upload what is there now")
    if (ident.size, ident.mtime_ns) != (f.size, f.mtime_ns):
        raise SourceChangedError(f"{path}: file changed since the job was planned; nothing of it is committed")
    return ident

