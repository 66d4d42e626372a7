"""The public library: copy() and resume() (with async twins), and job listing; the CLI only calls these."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from blobsync.backends.azure_auth import resolve_credential
from blobsync.backends.azure_rest import AzureContainerStore
from blobsync.config import TransferConfig
from blobsync.engine.bandwidth import TokenBucket, mbps_to_bytes
from blobsync.engine.context import Progress
from blobsync.engine.download_job import DownloadJob, DownloadSpec
from blobsync.engine.job import UploadJob, UploadSpec
from blobsync.errors import UsageError
from blobsync.journal import FileRow, JobRow, Journal, default_journal_path
from blobsync.location import BlobLocation, is_url, parse_location
from blobsync.report import Report
from blobsync.syncing.compare import CompareMode
from blobsync.syncing.filters import Filters
from blobsync.syncing.job import Action, DeleteMode, SyncJob, SyncSpec


def _journal(config: TransferConfig, env: Mapping[str, str]) -> Journal:
    return Journal(config.journal_path or default_journal_path(env))


def _bucket(config: TransferConfig) -> TokenBucket | None:
    return TokenBucket(mbps_to_bytes(config.cap_mbps)) if config.cap_mbps else None


def _store(loc: BlobLocation, config: TransferConfig, env: Mapping[str, str],
           bucket: TokenBucket | None = None) -> AzureContainerStore:
    return AzureContainerStore(
        loc,
        resolve_credential(loc, env),
        connections=config.max_concurrency + 4,
        read_timeout=config.stall_timeout,
        throttle=bucket.take if bucket else None,
    )


async def _run_download(
    loc: BlobLocation, dest: Path, config: TransferConfig, env: Mapping[str, str],
    progress: Progress | None, job: JobRow | None, journal: Journal, folder: bool = False,
) -> Report:
    bucket = _bucket(config)
    store = _store(loc, config, env, bucket)
    try:
        runner = DownloadJob(DownloadSpec(loc, dest, config, folder), store, journal, progress=progress, job=job)
        runner.runner.bandwidth = bucket
        return await runner.run()
    finally:
        await store.close()
        journal.close()


async def _run_upload(
    source: Path, loc: BlobLocation, config: TransferConfig, env: Mapping[str, str],
    progress: Progress | None, job: JobRow | None, journal: Journal,
) -> Report:
    bucket = _bucket(config)
    store = _store(loc, config, env, bucket)
    try:
        runner = UploadJob(UploadSpec(source, loc, config), store, journal, progress=progress, job=job)
        runner.runner.bandwidth = bucket
        return await runner.run()
    finally:
        await store.close()
        journal.close()


async def copy_async(
    source: str | os.PathLike[str],
    dest: str,
    config: TransferConfig | None = None,
    *,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> Report:
    """Upload a local file or folder to a blob URL, or download a blob (or, with `config.recursive`, every
    blob under a prefix) to a local path. The direction follows from which side is a URL. Re-running the same
    copy resumes its job."""
    config = config or TransferConfig()
    env = os.environ if env is None else env
    src_text = os.fspath(source)
    if is_url(src_text):
        if is_url(dest):
            raise UsageError("copying between two blob URLs is not supported: one side must be a local path")
        loc = parse_location(src_text)
        target = Path(dest).expanduser().absolute()
        folder = dest.endswith(("/", os.sep))
        return await _run_download(loc, target, config, env, progress, None, _journal(config, env), folder)
    if not is_url(dest):
        raise UsageError(f"destination {dest!r} is not a blob URL (https://<account>.blob.core.windows.net/...): "
                         "one side must be a URL")
    loc = parse_location(dest)
    src = Path(source).expanduser().absolute()
    return await _run_upload(src, loc, config, env, progress, None, _journal(config, env))


def copy(
    source: str | os.PathLike[str],
    dest: str,
    config: TransferConfig | None = None,
    *,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> Report:
    """Blocking form of `copy_async`."""
    return asyncio.run(copy_async(source, dest, config, env=env, progress=progress))


async def sync_async(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    config: TransferConfig | None = None,
    *,
    filters: Filters | None = None,
    compare: CompareMode = CompareMode.SIZE_AND_MTIME,
    delete: DeleteMode = DeleteMode.FALSE,
    max_delete: str | None = None,
    dry_run: bool = False,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    on_action: Callable[[Action], None] | None = None,
    confirm: Callable[[int], bool] | None = None,
) -> Report:
    """Make `dest` match `source`: a local folder and a container URL (optionally with a prefix), either way.

    Transfers what is new, differs in size, or is newer (or differs in MD5, or always: `compare`); with `delete`,
    removes destination files the source lacks, only after a complete enumeration and error-free transfers."""
    config = replace(config or TransferConfig(), recursive=True)
    env = os.environ if env is None else env
    src_text, dst_text = os.fspath(source), os.fspath(dest)
    if is_url(src_text) == is_url(dst_text):
        raise UsageError("sync needs one local folder and one container URL")
    upload = is_url(dst_text)
    loc = parse_location(dst_text if upload else src_text)
    local = Path(src_text if upload else dst_text).expanduser().absolute()
    spec = SyncSpec(local, loc, upload, config, filters or Filters(), compare, delete, max_delete, dry_run)
    journal = _journal(config, env)
    bucket = _bucket(config)
    store = _store(loc, config, env, bucket)
    try:
        job = SyncJob(spec, store, journal, progress=progress, on_action=on_action, confirm=confirm)
        job.runner.bandwidth = bucket
        return await job.run()
    finally:
        await store.close()
        journal.close()


def sync(source: str | os.PathLike[str], dest: str | os.PathLike[str], config: TransferConfig | None = None,
         **kwargs: Any) -> Report:
    """Blocking form of `sync_async`."""
    return asyncio.run(sync_async(source, dest, config, **kwargs))


async def resume_async(
    job_id: str,
    *,
    sas: str | None = None,
    journal_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    **overrides: object,
) -> Report:
    """Resume a journaled job. Credentials come from `sas` or the environment, never from the journal."""
    env = os.environ if env is None else env
    journal = Journal(journal_path or default_journal_path(env))
    try:
        job = journal.get_job(job_id)
        if job.state == "done":
            raise UsageError(f"job {job.id} is already done")
        if job.kind.startswith("sync"):
            # A sync re-compares both sides on every run; its partial files resume through the same journal.
            raise UsageError(f"job {job.id} is a sync: run the same 'blobsync sync' command again to resume it")
        config = TransferConfig.from_journal(job.options, journal_path=journal_path, **overrides)
        remote = job.source if job.kind == "download" else job.dest
        loc = parse_location(remote if not sas else f"{remote}?{sas.lstrip('?')}")
    except BaseException:
        journal.close()
        raise
    if job.kind == "download":
        return await _run_download(loc, Path(job.dest), config, env, progress, job, journal)
    return await _run_upload(Path(job.source), loc, config, env, progress, job, journal)


def resume(job_id: str, **kwargs: object) -> Report:
    """Blocking form of `resume_async`."""
    return asyncio.run(resume_async(job_id, **kwargs))  # type: ignore[arg-type]


@dataclass(frozen=True)
class JobSummary:
    job: JobRow
    totals: dict[str, dict[str, int]]


def list_jobs(journal_path: Path | None = None, env: Mapping[str, str] | None = None) -> list[JobSummary]:
    journal = Journal(journal_path or default_journal_path(os.environ if env is None else env))
    try:
        return [JobSummary(job, journal.job_totals(job.id)) for job in journal.list_jobs()]
    finally:
        journal.close()


def show_job(
    job_id: str, journal_path: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[JobSummary, list[FileRow]]:
    journal = Journal(journal_path or default_journal_path(os.environ if env is None else env))
    try:
        job = journal.get_job(job_id)
        return JobSummary(job, journal.job_totals(job.id)), journal.files(job.id)
    finally:
        journal.close()


def set_job_cap(job_id: str, cap_mbps: float, journal_path: Path | None = None,
                env: Mapping[str, str] | None = None) -> JobRow:
    """Change the bandwidth cap of a job started with --cap-mbps; a running job applies it within a second, a
    resumed one starts with it. Returns the job."""
    if not cap_mbps > 0:
        raise UsageError("the cap must be a positive number of megabits per second")
    journal = Journal(journal_path or default_journal_path(os.environ if env is None else env))
    try:
        job = journal.get_job(job_id)
        if not job.options.get("cap_mbps"):
            raise UsageError(f"job {job.id} runs without --cap-mbps, so it has no cap to change",
                             hint="start it with --cap-mbps to be able to change the cap while it runs")
        journal.set_job_cap(job.id, cap_mbps)
        return journal.get_job(job.id)
    finally:
        journal.close()


def clean_jobs(
    older_than_days: float | None = None,
    *,
    include_unfinished: bool = False,
    journal_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Forget finished jobs (all, or those older than N days); unfinished ones only when asked."""
    journal = Journal(journal_path or default_journal_path(os.environ if env is None else env))
    try:
        seconds = None if older_than_days is None else older_than_days * 86400
        return journal.delete_jobs(seconds, include_unfinished)
    finally:
        journal.close()
