"""What the library's calls do (copy, sync, watch, resume, remove), each run on the session it is handed: a
Client's methods run them on its session, and the module functions open a Client for the one call (blobsync.api)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from blobsync import arguments
from blobsync.backends.base import Location
from blobsync.backends.registry import is_remote, parse_location
from blobsync.config import TransferConfig
from blobsync.cp_arguments import plan_blob_copy, plan_copy
from blobsync.engine.delete import batch_enabled
from blobsync.engine.prompt import Answer
from blobsync.engine.session import Session
from blobsync.errors import BlobsyncError, TransferFailedError, UsageError
from blobsync.events import Progress, Subscriber
from blobsync.filters import Filters
from blobsync.jobs import CopySpec, DownloadSpec, Hooks, JobSpec, RemoveSpec, SyncSpec, UploadSpec, run_job
from blobsync.jobs.spec import Cluster, Processes, processes_target
from blobsync.journal import JobKind, JobRow, JobState, Journal, default_journal_path
from blobsync.journal.states import MEMORY_SOURCE
from blobsync.journal.store import damaged_row
from blobsync.options import CompareMode, DeleteMode, MaxDelete
from blobsync.report import Action, Report

# Imported where used: `blobsync sync` (and `import blobsync`) then never load the download and upload jobs, remove
# or watch (and watchfiles), which is a good part of a no-op sync's start-up.
if TYPE_CHECKING:
    from blobsync.jobs.spec import RemoteOpener
    from blobsync.jobs.watch import Ready

log = logging.getLogger("blobsync")
StopSignal = threading.Event | asyncio.Event | Callable[[], bool] | None
DeleteArg = DeleteMode | bool | Literal["true", "false", "prompt"]
CompareArg = CompareMode | Literal["size+mtime", "size-only", "md5", "mirror"]


def progress_of(progress: Progress | None, subscribers: Sequence[Subscriber]) -> Progress:
    """The Progress a job reports to; `subscribers` join it once (a Progress reused across calls does not
    collect the same subscriber again)."""
    progress = arguments.optional(progress, "progress", Progress, "a blobsync.Progress")
    progress = progress or Progress()
    new = [s for s in arguments.subscribers(subscribers) if not any(s is old for old in progress.subscribers)]
    if new:
        progress.subscribers = (*progress.subscribers, *new)
    return progress


def config_of(config: TransferConfig | None, session: Session | None = None) -> TransferConfig:
    """The call's config; without one, its session's (a Client's defaults), else the defaults."""
    given = arguments.optional(config, "config", TransferConfig, "a blobsync.TransferConfig")
    return given or (session.config if session is not None else TransferConfig())


def _check_common(filters: Filters | None, dry_run: bool, raise_on_error: bool, **callbacks: object) -> None:
    """The arguments most calls share: checked before anything else happens."""
    arguments.optional(filters, "filters", Filters, "a blobsync.Filters (Filters.parse(...))")
    arguments.boolean(dry_run, "dry_run")
    arguments.boolean(raise_on_error, "raise_on_error")
    for name, value in callbacks.items():
        arguments.callback(value, name)


def journal_at(journal_path: Path | None, env: Mapping[str, str] | None = None) -> Journal:
    """The journal at `journal_path`, else at the default place for this user (from `env`)."""
    return Journal(journal_path or default_journal_path(os.environ if env is None else env))


async def _run(session: Session, spec: JobSpec, config: TransferConfig, progress: Progress, hooks: Hooks,
               raise_on_error: bool, *, job: JobRow | None = None) -> Report:
    """Run one job on the session the call was handed; with `raise_on_error`, files that failed raise
    TransferFailedError."""
    report = await run_job(spec, session, config, progress=progress, hooks=hooks, job=job)
    if raise_on_error and report.failures:
        raise TransferFailedError(report)
    return report


async def copy_on(
    session: Session,
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    config: TransferConfig | None = None,
    *,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    subscribers: Sequence[Subscriber] = (),
    raise_on_error: bool = False,
    filters: Filters | None = None,
    as_subdir: bool = True,
    dry_run: bool = False,
    on_action: Callable[[Action], None] | None = None,
    confirm_overwrite: Callable[[str], Answer] | None = None,
    cluster: Cluster = None,
    list_of_files: str | os.PathLike[str] | None = None,
) -> Report:
    """Upload a local file or folder to a blob URL, or download a blob (or, with `config.recursive`, every
    blob under a prefix) to a local path, or copy between two blob URLs (the service moves the bytes). The
    direction follows from which side is a URL. Re-running the same copy resumes its job. `list_of_files` names a
    file of paths relative to the source, one per line (files, or folders with everything below them).

    Names follow AzCopy: a folder (or prefix) copied with `recursive` becomes a level of its own under the
    destination (`./run1` -> `<url>/run1/...`, `<url>/sub` -> `dest/sub/...`, a container URL ->
    `dest/<container>/...`); `as_subdir=False`, or a source ending in `/*`, copies the contents only. A last
    segment with '*' (`./ckpt/*.pt`, `<url>/sub/*`) selects among the entries at that level. `filters` choose
    files by name, path, regex or time; `dry_run` reports each file (`on_action`) and moves nothing.
    With `config.overwrite` PROMPT, `confirm_overwrite(description)` is asked (in a worker thread, one file at a
    time) about each file that exists at the destination and answers an `Answer` (yes, no, all, none).

    `cluster` runs the transfers on Dask workers (a `distributed.Client`, 'tcp://scheduler:8786', or 'local:N'
    for N worker processes here); the local side must be the same path on every worker. 'processes:N' (or
    'processes:auto') runs them in N worker processes of blobsync's own here, without Dask (`--processes`).

    Files that fail are listed in the returned Report (`report.failures`); with `raise_on_error=True` they
    raise TransferFailedError instead. Errors that stop the whole job (credentials, a missing container, bad
    arguments) always raise. Cancelling the task leaves the job resumable."""
    config = config_of(config, session)
    source, dest = arguments.path_or_url(source, "source"), arguments.path_or_url(dest, "dest")
    _check_common(filters, dry_run, raise_on_error, on_action=on_action, confirm_overwrite=confirm_overwrite)
    as_subdir = arguments.boolean(as_subdir, "as_subdir")
    env = arguments.env(env)
    progress = progress_of(progress, subscribers)
    list_of_files = arguments.optional_path(list_of_files, "list_of_files")
    if list_of_files is not None:  # the paths it names (files, or folders with all below them) under the source
        filters = (filters or Filters()).narrowed(list_of_files=str(list_of_files))
        config = replace(config, recursive=True)
    spec, config, remote = _copy_spec(source, dest, config, as_subdir, filters, dry_run, _cluster_arg(cluster))
    hooks = Hooks(on_action, confirm_overwrite, remote=remote)
    return await _run(session, spec, config, progress, hooks, raise_on_error)


def _copy_spec(source: str, dest: str, config: TransferConfig, as_subdir: bool, filters: Filters | None,
               dry_run: bool, cluster: Cluster) -> tuple[JobSpec, TransferConfig, RemoteOpener | None]:
    """The job a cp's two arguments describe (an upload, a download, or a copy between two URLs), and where its
    files run."""
    if is_remote(source) and is_remote(dest):
        both = plan_blob_copy(source, dest, recursive=config.recursive, as_subdir=as_subdir,
                              filters=filters or Filters())
        return (CopySpec(both.source, both.dest, both.many, both.filters, dry_run),
                replace(config, recursive=both.many), _remote(cluster, dest, source))
    plan = plan_copy(source, dest, recursive=config.recursive, as_subdir=as_subdir, filters=filters)
    spec: JobSpec = UploadSpec(plan.local, plan.remote, plan.filters, dry_run) if plan.upload else \
        DownloadSpec(plan.remote, plan.local, plan.dest_is_folder, plan.filters, dry_run, plan.base)
    return spec, replace(config, recursive=plan.many), _remote(cluster, dest if plan.upload else source)


async def sync_on(
    session: Session,
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    config: TransferConfig | None = None,
    *,
    filters: Filters | None = None,
    compare: CompareArg = CompareMode.SIZE_AND_MTIME,
    delete: DeleteArg = DeleteMode.FALSE,
    max_delete: str | int | MaxDelete | None = None,
    dry_run: bool = False,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    on_action: Callable[[Action], None] | None = None,
    confirm: Callable[[int], bool] | None = None,
    subscribers: Sequence[Subscriber] = (),
    raise_on_error: bool = False,
    ready: Ready | None = None,
    cluster: Cluster = None,
) -> Report:
    """Make `dest` match `source`: a local folder and a container URL (optionally with a prefix), either way.

    Transfers what is new, differs in size, or is newer (or differs in MD5, or always: `compare`); with `delete`,
    removes destination files the source lacks, only after a complete enumeration and error-free transfers.
    `on_action` sees each decision (transfer or delete, with its reason); `confirm(n)` answers DeleteMode.PROMPT.
    Uploads: `ready(rel, mtime_ns)`, if given, holds back files it returns False for (neither sent nor deleted).
    A changed file whose previous version blobsync committed sends only its changed blocks (delta).
    `cluster` runs the transfers on Dask workers, as for `copy` (the comparison and deletes stay here)."""
    config = replace(config_of(config, session), recursive=True)
    src_text, dst_text = arguments.path_or_url(source, "source"), arguments.path_or_url(dest, "dest")
    _check_common(filters, dry_run, raise_on_error, on_action=on_action, confirm=confirm)
    delete, compare = arguments.choice(delete, DeleteMode, "delete"), arguments.choice(compare, CompareMode, "compare")
    max_delete = MaxDelete.parse(max_delete)
    arguments.callback(ready, "ready")
    env = arguments.env(env)
    progress = progress_of(progress, subscribers)
    sides, config = _sync_sides(src_text, dst_text, config)
    spec = SyncSpec(*sides[:3], filters or Filters(), compare, delete, max_delete, dry_run, ready, batch_enabled(env),
                    source=sides[3])
    cluster = _cluster_arg(cluster)
    if spec.source is not None and cluster is not None:
        raise UsageError("a sync between two URLs runs on this machine (the service moves the bytes): drop "
                         "--cluster or --processes, or use cp -r with them")
    hooks = Hooks(on_action, confirm_delete=confirm, remote=_remote(cluster, dst_text if spec.upload else src_text))
    return await _run(session, spec, config, progress, hooks, raise_on_error)


def _sync_sides(src_text: str, dst_text: str, config: TransferConfig
                ) -> tuple[tuple[Path | None, Location, bool, Location | None], TransferConfig]:
    """A sync's sides as SyncSpec takes them (local folder, container side, upload, blob-to-blob source): local to a
    container, a container to local, or blob to blob."""
    if is_remote(src_text) and is_remote(dst_text):
        return (None, parse_location(dst_text), True, parse_location(src_text)), config
    if not is_remote(src_text) and not is_remote(dst_text):
        raise UsageError("sync needs a container URL on at least one side (the other a local folder, or a URL)")
    upload = is_remote(dst_text)
    local = Path(src_text if upload else dst_text).expanduser().absolute()
    if not upload:  # a file brought down keeps the blob's time: the next sync compares equal
        config = replace(config, preserve_last_modified_time=True)
    return (local, parse_location(dst_text if upload else src_text), upload, None), config


def _stop_check(stop: StopSignal) -> Callable[[], bool]:
    if stop is None:
        return lambda: False
    if isinstance(stop, threading.Event | asyncio.Event):
        return stop.is_set
    return stop


async def watch_on(
    session: Session,
    source: str | os.PathLike[str],
    dest: str,
    config: TransferConfig | None = None,
    *,
    settle: float = 2.0,
    stop: StopSignal = None,
    filters: Filters | None = None,
    compare: CompareArg = CompareMode.SIZE_AND_MTIME,
    delete: DeleteArg = DeleteMode.FALSE,
    max_delete: str | int | MaxDelete | None = None,
    env: Mapping[str, str] | None = None,
    on_round: Callable[[Report], None] | None = None,
    on_error: Callable[[BlobsyncError, float], None] | None = None,
) -> int:
    """Sync the local folder `source` to the container URL `dest`, then keep syncing what changes until `stop`.

    A file is sent once it has not been modified for `settle` seconds (a checkpoint being written is never
    sent half-way); bursts of changes become one round; changed files go up as deltas. A round that fails
    (network gone) is retried with backoff and resumes what was staged; auth and usage errors raise.
    `stop` is a threading.Event, asyncio.Event or callable, checked between rounds (a running round finishes);
    cancelling the task stops at once, leaving partial files resumable. Returns the number of rounds run."""
    from blobsync.jobs.watch import Watcher

    src_text, dest = arguments.path_or_url(source, "source"), arguments.url(dest, "dest")
    settle = arguments.number(settle, "settle", 0, 86400, " seconds")
    arguments.stop_signal(stop)
    _check_common(filters, False, False, on_round=on_round, on_error=on_error)
    delete, compare = arguments.choice(delete, DeleteMode, "delete"), arguments.choice(compare, CompareMode, "compare")
    max_delete = MaxDelete.parse(max_delete)
    if is_remote(src_text) or not is_remote(dest):
        raise UsageError("watch needs a local folder as the source and a container URL as the destination")
    if delete is DeleteMode.PROMPT:
        raise UsageError("--delete-destination prompt cannot be used with --watch: use true or false")
    config = replace(config_of(config, session), recursive=True)
    env = arguments.env(env)
    root = Path(src_text).expanduser().absolute()
    if not root.is_dir():
        raise UsageError(f"source folder {src_text!r} does not exist or is not a folder")
    journal_path = config.journal_path or default_journal_path(env)

    loc = parse_location(dest)

    # Every round on the one session: one pool, one token.
    async def one_round(ready: Ready) -> Report:
        spec = SyncSpec(root, loc, True, filters or Filters(), compare, delete, max_delete, ready=ready,
                        batch_deletes=batch_enabled(env))
        return await run_job(spec, session, config, progress=Progress())

    # Our own writes (journal, scratch index) must not look like changes when they live inside the folder.
    ignore = (str(journal_path), str(journal_path.parent / "blobsync-index-"))
    watcher = Watcher(root, one_round, settle=settle, stop=_stop_check(stop), on_round=on_round,
                      on_error=on_error, ignore=ignore)
    await watcher.run()
    return watcher.rounds


async def resume_on(
    session: Session,
    job_id: str | JobSummary | JobRow,
    *,
    sas: str | None = None,
    journal_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    subscribers: Sequence[Subscriber] = (),
    raise_on_error: bool = False,
    confirm_overwrite: Callable[[str], Answer] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Report:
    """Resume a journaled copy job by id. Credentials come from `sas` or the environment, never from the
    journal; `overrides` replace stored options by TransferConfig field name (e.g. {"concurrency": 4}). `job_id`
    may be what `list_jobs()` returns. A job already done is left alone: the report says so (nothing moved)."""
    job_id = job_id_of(job_id)
    arguments.optional(sas, "sas", str, "the SAS text")
    journal_path = arguments.optional_path(journal_path, "journal_path")
    _check_common(None, False, raise_on_error, confirm_overwrite=confirm_overwrite)
    overrides = dict(arguments.optional(overrides, "overrides", Mapping, "a mapping of TransferConfig fields") or {})
    unknown = sorted(set(overrides) - {f.name for f in fields(TransferConfig)})
    if unknown:
        raise UsageError(f"invalid overrides: {', '.join(unknown)} (use TransferConfig field names)")
    env = arguments.env(env)
    progress = progress_of(progress, subscribers)
    journal = session.journal
    job = journal.get_job(job_id)
    if job.state is JobState.DONE:
        log.info("job %s is already done: nothing to resume", job.id)
        return Report(job.id, job.source, job.dest, kind="download" if job.kind is JobKind.DOWNLOAD else "upload")
    if job.source.startswith(MEMORY_SOURCE):
        journal.set_job_state(job.id, JobState.ABANDONED)
        raise UsageError(f"job {job.id} put data that a process held in memory, and that process ended before "
                         "the put did: nothing is left to resume", hint="put the data again")
    if job.kind is JobKind.COPY:
        raise UsageError(f"job {job.id} copies between two URLs: run the same 'blobsync cp' command again to "
                         "resume it (each side's credentials come from its URL or the environment)")
    if job.kind.is_sync:
        # A sync re-compares both sides on every run; its partial files resume through the same journal.
        raise UsageError(f"job {job.id} is a sync: run the same 'blobsync sync' command again to resume it")
    options = dict(job.options)
    filters = Filters.from_journal(options.pop("filters", None))
    config = _journaled_config(job, options, journal_path, overrides)
    remote = job.source if job.kind is JobKind.DOWNLOAD else job.dest
    loc = parse_location(remote)
    loc = loc.with_sas(sas) if sas else loc
    spec: JobSpec = DownloadSpec(loc, Path(job.dest), filters=filters) if job.kind is JobKind.DOWNLOAD else \
        UploadSpec(Path(job.source), loc, filters)
    return await _run(session, spec, config, progress, Hooks(confirm_overwrite=confirm_overwrite),
                      raise_on_error, job=job)


def _journaled_config(job: JobRow, options: dict[str, object], journal_path: str | os.PathLike[str] | None,
                      overrides: Mapping[str, object]) -> TransferConfig:
    """The config a job was journaled with, `overrides` on top; a row naming options this blobsync does not know
    (another version's, or edited) is damaged: one line, not a TypeError."""
    unknown = sorted(str(k) for k in options if k not in {f.name for f in fields(TransferConfig)})
    if unknown:
        raise damaged_row("job", job.id, UsageError(f"unknown option(s) {', '.join(map(repr, unknown))}"))
    return TransferConfig.from_journal(options, journal_path=journal_path, **overrides)


def _remote(cluster: Cluster, url: str, source_url: str = "") -> RemoteOpener | None:
    """Where a job's files run: on `cluster` (its code loaded only then), or None: in this process."""
    if cluster is None:
        return None
    from blobsync.cluster.client import remote

    return remote(cluster, url, source_url)


def _cluster_arg(cluster: Cluster) -> Cluster:
    if cluster is not None and not isinstance(cluster, str | Processes) and not hasattr(cluster, "scheduler"):
        raise UsageError(f"invalid cluster={cluster!r}: a distributed.Client, 'tcp://host:8786', 'local:N' or "
                         "'processes:N'")
    return processes_target(cluster)


@dataclass(frozen=True)
class JobSummary:
    job: JobRow
    totals: dict[str, dict[str, int]]


def job_id_of(job: object) -> str:
    """A job's id from what a caller holds: the id, or what list_jobs() and show_job() return."""
    if isinstance(job, JobSummary):
        return job.job.id
    if isinstance(job, JobRow):
        return job.id
    arguments.url(job, "job_id")
    assert isinstance(job, str)
    return job


async def remove_on(
    session: Session,
    url: str,
    config: TransferConfig | None = None,
    *,
    recursive: bool = False,
    filters: Filters | None = None,
    dry_run: bool = False,
    list_of_files: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    subscribers: Sequence[Subscriber] = (),
    on_action: Callable[[Action], None] | None = None,
    raise_on_error: bool = False,
) -> Report:
    """Delete the blob the URL names or, with `recursive`, every blob under it that `filters` admit
    (snapshots go with their blob); or the blobs `list_of_files` names (one relative name per line).
    `dry_run` lists what would go and deletes nothing."""
    config, url = config_of(config, session), arguments.url(url, "url")
    _check_common(filters, dry_run, raise_on_error, on_action=on_action)
    recursive = arguments.boolean(recursive, "recursive")
    list_of_files = arguments.optional_path(list_of_files, "list_of_files")
    env = arguments.env(env)
    progress = progress_of(progress, subscribers)
    loc = parse_location(url)
    spec = RemoveSpec(loc, recursive, filters or Filters(), dry_run, config.max_concurrency,
                      Path(list_of_files) if list_of_files is not None else None, batch_enabled(env))
    return await _run(session, spec, config, progress, Hooks(on_action), raise_on_error)


