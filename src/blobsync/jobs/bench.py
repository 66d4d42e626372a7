"""`blobsync bench`: generated data up to a folder of its own, down again, then deleted, measured phase by phase,
with what bounded each phase and the flags that would help."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from blobsync.backends.base import Location
from blobsync.config import AUTO_CEILING, TransferConfig
from blobsync.engine.session import Session
from blobsync.engine.sources import GeneratedSource
from blobsync.events import Progress
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import JobRunner, WorkItem
from blobsync.jobs.spec import DownloadSpec, RemoveSpec
from blobsync.journal import JobKind
from blobsync.naming import folder_prefix
from blobsync.report import Report

BUSY = 0.85  # a phase whose client CPU is this share of its wall time had the client's core busy


@dataclass(frozen=True)
class BenchSpec:
    dest: Location  # the container (or a folder in it) the test folder is made under
    size: int  # bytes per file
    count: int
    download: bool = True  # then download what was uploaded
    delete: bool = True  # then delete the test folder (and the local copy)
    scratch: Path | None = None  # where downloads land (a temporary folder, removed after)


@dataclass
class Phase:
    name: str  # upload | download
    files: int
    bytes: int
    seconds: float
    cpu_seconds: float  # this process's CPU, all threads
    concurrency: int  # where it settled (or the fixed level)
    concurrency_auto: bool
    retries: int
    throttled: int
    failed: int
    bound: str = ""
    suggestions: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else 0.0


@dataclass
class BenchResult:
    folder: str  # the test folder's URL (no SAS)
    phases: list[Phase]
    deleted: int = 0  # test blobs deleted at the end


def judge(phase: Phase, config: TransferConfig, size: int) -> Phase:
    """What bounded the phase, in words, and the flags that would help."""
    cpu_share = phase.cpu_seconds / phase.seconds if phase.seconds > 0 else 0.0
    if phase.throttled:
        phase.bound = f"service throttling ({phase.throttled} requests refused with 429/503)"
        phase.suggestions.append("a lower --concurrency, or --cap-mbps, keeps under the account's limits")
    elif config.cap_mbps and phase.mb_per_s * 8 >= 0.9 * config.cap_mbps:
        phase.bound = f"the bandwidth cap (--cap-mbps {config.cap_mbps:g})"
    elif cpu_share >= BUSY:
        phase.bound = f"this machine's CPU (one core {cpu_share:.0%} busy)"
        if size >= 8 * 1024 * 1024:
            phase.suggestions.append("--no-put-md5 skips the whole-file MD5 (AzCopy's default), and a larger "
                                     "--block-size-mb costs fewer requests")
    else:
        where = "the link, the service or the local disk" if phase.name == "download" else "the link or the service"
        phase.bound = f"{where} (the client was idle {1 - cpu_share:.0%} of the time, waiting on answers)"
        if phase.concurrency >= (AUTO_CEILING if phase.concurrency_auto else config.max_concurrency):
            phase.suggestions.append(f"--concurrency above {phase.concurrency} may go faster (the ceiling was "
                                     "reached)")
    return phase


def _phase(name: str, report: Report, seconds: float, cpu: float) -> Phase:
    return Phase(name, report.files_transferred, report.bytes_transferred, seconds, cpu, report.concurrency,
                 report.concurrency_auto, report.retries, report.throttled, report.files_failed)


async def _upload(spec: BenchSpec, folder: Location, session: Session, config: TransferConfig) -> Report:
    """The generated files up, as an upload job of their own (journaled, checked, verified like any other)."""
    ctx = session.context(folder, config, progress=Progress())
    runner = JobRunner(JobKind.UPLOAD, ctx)
    job = runner.open_job(f"bench:{folder.path}", folder.display)
    names = [f"{folder.path}f{i:06d}.bin" for i in range(spec.count)]
    rows = ctx.journal.add_files(job.id, ((name, name, spec.size, 0, 0) for name in names))
    report = Report(job.id, "<generated>", folder.display, listener=ctx.progress.finished)
    pattern = GeneratedSource.pattern()

    def item(i: int, name: str) -> WorkItem:
        data = GeneratedSource(name, spec.size, i * 7919, pattern)
        return WorkItem(rows[name], FileOp(OpKind.PUT, name, name, spec.size, 0, data=data))

    await runner.run(report, (item(i, name) for i, name in enumerate(names)), (spec.count, spec.count * spec.size))
    return report


async def run_bench(spec: BenchSpec, session: Session, config: TransferConfig) -> BenchResult:
    """Upload, (download,) delete; each phase timed on its own."""
    from blobsync.jobs import run_job

    stamp = time.strftime("%Y%m%dT%H%M%S")
    folder = spec.dest.with_path(f"{folder_prefix(spec.dest.path)}blobsync-bench-{stamp}-{uuid.uuid4().hex[:8]}/")
    result = BenchResult(folder.display, [])
    scratch = Path(tempfile.mkdtemp(prefix="blobsync-bench-", dir=spec.scratch))
    try:
        started, cpu = time.perf_counter(), time.process_time()
        up = await _upload(spec, folder, session, config)
        result.phases.append(judge(_phase("upload", up, time.perf_counter() - started, time.process_time() - cpu),
                                   config, spec.size))
        if spec.download and up.ok:
            started, cpu = time.perf_counter(), time.process_time()
            down = await run_job(DownloadSpec(folder, scratch / "data"), session, replace(config, recursive=True),
                                 progress=Progress())
            result.phases.append(judge(_phase("download", down, time.perf_counter() - started,
                                              time.process_time() - cpu), config, spec.size))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if spec.delete:
            gone = await run_job(RemoveSpec(folder, recursive=True, concurrency=config.max_concurrency), session,
                                 config, progress=Progress())
            result.deleted = gone.files_deleted
    return result
