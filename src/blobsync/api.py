"""The public library: copy, sync, resume, list and remove (blocking; async twins in blobsync.aio), and jobs."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

from blobsync import arguments, stopping
from blobsync.backends.base import BlobProperties, Location
from blobsync.backends.registry import is_remote, parse_location
from blobsync.config import TransferConfig, check_proxy_url
from blobsync.cp_arguments import plan_blob_copy, plan_copy
from blobsync.engine.context import RequestPath
from blobsync.engine.delete import batch_enabled
from blobsync.engine.prompt import Answer
from blobsync.engine.session import Session
from blobsync.errors import BlobsyncError, TransferFailedError, UsageError
from blobsync.events import Progress, Subscriber
from blobsync.filters import Filters
from blobsync.jobs import CopySpec, DownloadSpec, Hooks, JobSpec, RemoveSpec, SyncSpec, UploadSpec, run_job
from blobsync.jobs.spec import Cluster, Processes, processes_target
from blobsync.journal import FileRow, JobKind, JobRow, JobState, Journal, default_journal_path
from blobsync.journal.states import MEMORY_SOURCE
from blobsync.journal.store import damaged_row
from blobsync.options import CompareMode, DeleteMode, MaxDelete
from blobsync.report import Action, Report

# Imported where used: `blobsync sync` (and `import blobsync`) then never load the doctor, the download and
# upload jobs, remove or watch (and watchfiles), which is a good part of a no-op sync's start-up.
if TYPE_CHECKING:
    from blobsync.backends.diagnosis import Diagnosis
    from blobsync.jobs.spec import RemoteOpener
    from blobsync.jobs.watch import Ready
    from blobsync.journal.jobs import JobBook

log = logging.getLogger("blobsync")
T = TypeVar("T")
P = ParamSpec("P")
StopSignal = threading.Event | asyncio.Event | Callable[[], bool] | None
DeleteArg = DeleteMode | bool | Literal["true", "false", "prompt"]
CompareArg = CompareMode | Literal["size+mtime", "size-only", "md5", "mirror"]


def _blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion from synchronous code, even where an event loop already runs in this thread
    (a notebook, an async training framework): then it runs on a loop of its own in a helper thread."""
    try:
        running = True
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    # Chosen outside the except block: an error of the call must not carry "no running event loop" as its context.
    return stopping.run_beside(coro) if running else stopping.run(coro)


def alone(fn: Callable[Concatenate[Session | None, P], Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """The module function of a call that takes its session first: a session of its own for this call alone."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return await fn(None, *args, **kwargs)

    call.__name__ = fn.__name__.removesuffix("_on") + "_async"
    return call


def on_session(fn: Callable[Concatenate[Session | None, P], Coroutine[Any, Any, T]], session: Session | None
               ) -> Callable[P, T]:
    """The blocking form of a call run on `session` (None: one of its own), as the CLI's commands call them."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return _blocking(fn(session, *args, **kwargs))

    return run


def blocking_form(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking twin of an async library call, with its exact signature (so a type checker catches a
    misspelt keyword or a wrong type at the caller)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return _blocking(fn(*args, **kwargs))

    run.__doc__ = f"Blocking form of `blobsync.aio.{fn.__name__.removesuffix('_async')}`.\n\n{fn.__doc__ or ''}"
    return run


def _progress(progress: Progress | None, subscribers: Sequence[Subscriber]) -> Progress:
    """The Progress a job reports to; `subscribers` join it once (a Progress reused across calls does not
    collect the same subscriber again)."""
    progress = arguments.optional(progress, "progress", Progress, "a blobsync.Progress")
    progress = progress or Progress()
    new = [s for s in arguments.subscribers(subscribers) if not any(s is old for old in progress.subscribers)]
    if new:
        progress.subscribers = (*progress.subscribers, *new)
    return progress


def _config(config: TransferConfig | None, session: Session | None = None) -> TransferConfig:
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


def _suffixes(value: object) -> tuple[str, ...]:
    """trusted_suffixes as the library takes it: a sequence of host names or domains (or one ';'-joined text)."""
    from blobsync.config import parse_suffixes

    if isinstance(value, str):
        return parse_suffixes(value)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return parse_suffixes(";".join(value))
    raise UsageError(f"invalid trusted_suffixes={value!r}: a list of host names or domains")


def _journal(journal_path: Path | None, env: Mapping[str, str] | None = None) -> Journal:
    """The journal at `journal_path`, else at the default place for this user (from `env`)."""
    return Journal(journal_path or default_journal_path(os.environ if env is None else env))


async def _run(session: Session | None, spec: JobSpec, config: TransferConfig, env: Mapping[str, str],
               progress: Progress, hooks: Hooks, raise_on_error: bool, *, job: JobRow | None = None,
               journal: Journal | None = None) -> Report:
    """Run one job on the session a call was given (a Client's, `blobsync run`'s) or on one of its own (closed after
    it, with its journal); with `raise_on_error`, files that failed raise TransferFailedError."""
    async with _session_for(session, config, env, progress, journal) as session:
        report = await run_job(spec, session, config, progress=progress, hooks=hooks, job=job)
    if raise_on_error and report.failures:
        raise TransferFailedError(report)
    return report


@asynccontextmanager
async def _session_for(session: Session | None, config: TransferConfig, env: Mapping[str, str], progress: Progress,
                       journal: Journal | None = None) -> AsyncIterator[Session]:
    if session is not None:
        yield session
        return
    session = Session(config, env, journal or (lambda: _journal(config.journal_path, env)), wire_progress=progress)
    try:
        yield session
    finally:
        await session.close()


async def copy_on(
    session: Session | None,
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
    config = _config(config, session)
    source, dest = arguments.path_or_url(source, "source"), arguments.path_or_url(dest, "dest")
    _check_common(filters, dry_run, raise_on_error, on_action=on_action, confirm_overwrite=confirm_overwrite)
    as_subdir = arguments.boolean(as_subdir, "as_subdir")
    env = arguments.env(env)
    progress = _progress(progress, subscribers)
    list_of_files = arguments.optional_path(list_of_files, "list_of_files")
    if list_of_files is not None:  # the paths it names (files, or folders with all below them) under the source
        filters = (filters or Filters()).narrowed(list_of_files=str(list_of_files))
        config = replace(config, recursive=True)
    spec, config, remote = _copy_spec(source, dest, config, as_subdir, filters, dry_run, _cluster_arg(cluster))
    hooks = Hooks(on_action, confirm_overwrite, remote=remote)
    return await _run(session, spec, config, env, progress, hooks, raise_on_error)


copy_async = alone(copy_on)
copy = blocking_form(copy_async)


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
    session: Session | None,
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
    config = replace(_config(config, session), recursive=True)
    src_text, dst_text = arguments.path_or_url(source, "source"), arguments.path_or_url(dest, "dest")
    _check_common(filters, dry_run, raise_on_error, on_action=on_action, confirm=confirm)
    delete, compare = arguments.choice(delete, DeleteMode, "delete"), arguments.choice(compare, CompareMode, "compare")
    max_delete = MaxDelete.parse(max_delete)
    arguments.callback(ready, "ready")
    env = arguments.env(env)
    progress = _progress(progress, subscribers)
    sides, config = _sync_sides(src_text, dst_text, config)
    spec = SyncSpec(*sides[:3], filters or Filters(), compare, delete, max_delete, dry_run, ready, batch_enabled(env),
                    source=sides[3])
    cluster = _cluster_arg(cluster)
    if spec.source is not None and cluster is not None:
        raise UsageError("a sync between two URLs runs on this machine (the service moves the bytes): drop "
                         "--cluster or --processes, or use cp -r with them")
    hooks = Hooks(on_action, confirm_delete=confirm, remote=_remote(cluster, dst_text if spec.upload else src_text))
    return await _run(session, spec, config, env, progress, hooks, raise_on_error)


sync_async = alone(sync_on)
sync = blocking_form(sync_async)


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
    session: Session | None,
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
    config = replace(_config(config, session), recursive=True)
    env = arguments.env(env)
    root = Path(src_text).expanduser().absolute()
    if not root.is_dir():
        raise UsageError(f"source folder {src_text!r} does not exist or is not a folder")
    journal_path = config.journal_path or default_journal_path(env)

    loc = parse_location(dest)
    # Every round on one session: one pool, one token.
    async with _session_for(session, config, env, Progress()) as session:

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


watch_async = alone(watch_on)
watch = blocking_form(watch_async)  # run it in a thread beside a training loop, with stop=threading.Event()


async def resume_on(
    session: Session | None,
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
    job_id = _job_id(job_id)
    arguments.optional(sas, "sas", str, "the SAS text")
    journal_path = arguments.optional_path(journal_path, "journal_path")
    _check_common(None, False, raise_on_error, confirm_overwrite=confirm_overwrite)
    overrides = dict(arguments.optional(overrides, "overrides", Mapping, "a mapping of TransferConfig fields") or {})
    unknown = sorted(set(overrides) - {f.name for f in fields(TransferConfig)})
    if unknown:
        raise UsageError(f"invalid overrides: {', '.join(unknown)} (use TransferConfig field names)")
    env = arguments.env(env)
    progress = _progress(progress, subscribers)
    journal = session.journal if session is not None else _journal(journal_path, env)
    try:
        job = journal.get_job(job_id)
        if job.state is JobState.DONE:
            log.info("job %s is already done: nothing to resume", job.id)
            if session is None:
                journal.close()
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
    except BaseException:
        if session is None:
            journal.close()
        raise
    spec: JobSpec = DownloadSpec(loc, Path(job.dest), filters=filters) if job.kind is JobKind.DOWNLOAD else \
        UploadSpec(Path(job.source), loc, filters)
    return await _run(session, spec, config, env, progress, Hooks(confirm_overwrite=confirm_overwrite),
                      raise_on_error, job=job, journal=journal)


def _journaled_config(job: JobRow, options: dict[str, object], journal_path: str | os.PathLike[str] | None,
                      overrides: Mapping[str, object]) -> TransferConfig:
    """The config a job was journaled with, `overrides` on top; a row naming options this blobsync does not know
    (another version's, or edited) is damaged: one line, not a TypeError."""
    unknown = sorted(str(k) for k in options if k not in {f.name for f in fields(TransferConfig)})
    if unknown:
        raise damaged_row("job", job.id, UsageError(f"unknown option(s) {', '.join(map(repr, unknown))}"))
    return TransferConfig.from_journal(options, journal_path=journal_path, **overrides)


resume_async = alone(resume_on)
resume = blocking_form(resume_async)


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


def _book(journal: Journal) -> JobBook:
    from blobsync.journal.jobs import JobBook  # sqlite-utils: loaded by the `jobs` commands only

    return JobBook(journal)


@dataclass(frozen=True)
class JobSummary:
    job: JobRow
    totals: dict[str, dict[str, int]]


def list_jobs(journal_path: Path | None = None, env: Mapping[str, str] | None = None) -> list[JobSummary]:
    with _journal(journal_path, env) as journal:
        book = _book(journal)
        return [JobSummary(job, book.job_totals(job.id)) for job in book.list_jobs()]


def show_job(
    job_id: str | JobSummary | JobRow, journal_path: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[JobSummary, list[FileRow]]:
    with _journal(journal_path, env) as journal:
        job, book = journal.get_job(_job_id(job_id)), _book(journal)
        return JobSummary(job, book.job_totals(job.id)), book.files(job.id)


def _job_id(job: object) -> str:
    """A job's id from what a caller holds: the id, or what list_jobs() and show_job() return."""
    if isinstance(job, JobSummary):
        return job.job.id
    if isinstance(job, JobRow):
        return job.id
    arguments.url(job, "job_id")
    assert isinstance(job, str)
    return job


def set_job_cap(job_id: str, cap_mbps: float, journal_path: Path | None = None,
                env: Mapping[str, str] | None = None) -> JobRow:
    """Change the bandwidth cap of a job started with --cap-mbps; a running job applies it within a second, a
    resumed one starts with it. Returns the job."""
    arguments.number(cap_mbps, "cap_mbps", 0.001, 1_000_000, " Mbit/s")
    with _journal(journal_path, env) as journal:
        job = journal.get_job(job_id)
        if not job.options.get("cap_mbps"):
            raise UsageError(f"job {job.id} runs without --cap-mbps, so it has no cap to change",
                             hint="start it with --cap-mbps to be able to change the cap while it runs")
        _book(journal).set_job_cap(job.id, cap_mbps)
        return journal.get_job(job.id)


def clean_jobs(
    older_than_days: float | None = None,
    *,
    include_unfinished: bool = False,
    journal_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Forget finished jobs (all, or those older than N days); unfinished ones only when asked."""
    with _journal(journal_path, env) as journal:
        seconds = None if older_than_days is None else older_than_days * 86400
        return _book(journal).delete_jobs(seconds, include_unfinished)


def _short_call(url: object, env: Mapping[str, str] | None, max_retries: int, proxy: str | None,
                trusted_suffixes: Sequence[str]) -> tuple[Location, Session, RequestPath]:
    """ls and make: their arguments checked, and a session of their own that keeps no journal (opened on the
    journal's first use, never here) with its request path."""
    loc, env = parse_location(arguments.url(url, "url")), arguments.env(env)
    max_retries = int(arguments.number(max_retries, "max_retries", 0, 100, integer=True))
    arguments.optional(proxy, "proxy", str, "a proxy URL")
    config = TransferConfig(max_retries=max_retries, proxy=proxy, trusted_suffixes=_suffixes(trusted_suffixes))
    session = Session(config, env, lambda: _journal(config.journal_path, env))
    return loc, session, session.requests(config, Progress())


async def list_blobs_async(
    url: str, *, env: Mapping[str, str] | None = None, max_retries: int = 8, proxy: str | None = None,
    trusted_suffixes: Sequence[str] = (),
) -> AsyncIterator[BlobProperties]:
    """Every blob the URL names: the blob itself, or all blobs under the container or folder, page by page
    (memory stays flat on huge containers). Each item has name, size, tier, Content-MD5, last modified."""
    async for _, props in blob_entries_async(url, env=env, max_retries=max_retries, proxy=proxy,
                                             trusted_suffixes=trusted_suffixes):
        yield props


async def blob_entries_async(
    url: str, *, env: Mapping[str, str] | None = None, max_retries: int = 8, proxy: str | None = None,
    trusted_suffixes: Sequence[str] = (),
) -> AsyncIterator[tuple[str, BlobProperties]]:
    """As `list_blobs_async`, each blob with its name relative to the URL (a blob URL: its last segment), as
    AzCopy's list prints them."""
    from blobsync.engine.listing import blobs_at

    loc, session, requests = _short_call(url, env, max_retries, proxy, trusted_suffixes)
    try:
        async for entry in blobs_at(session.store(loc), loc.path, requests):
            yield entry
    finally:
        await session.close()


async def make_container_async(url: str, *, env: Mapping[str, str] | None = None, max_retries: int = 8,
                               proxy: str | None = None, trusted_suffixes: Sequence[str] = ()) -> bool:
    """Create the container the URL names; False when it exists already."""
    loc, session, requests = _short_call(url, env, max_retries, proxy, trusted_suffixes)
    try:
        if loc.path:
            raise UsageError(f"{loc.display!r} names a blob or folder: make takes a container URL")
        return await requests(session.store(loc).create_container)
    finally:
        await session.close()


make_container = blocking_form(make_container_async)


async def _collect_blobs(url: str, *, env: Mapping[str, str] | None = None, max_retries: int = 8,
                         proxy: str | None = None, trusted_suffixes: Sequence[str] = ()) -> list[BlobProperties]:
    """Every blob the URL names, as a list (see `blobsync.aio.list_blobs`)."""
    return [props async for props in list_blobs_async(url, env=env, max_retries=max_retries, proxy=proxy,
                                                      trusted_suffixes=trusted_suffixes)]


list_blobs = blocking_form(_collect_blobs)


async def remove_on(
    session: Session | None,
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
    config, url = _config(config, session), arguments.url(url, "url")
    _check_common(filters, dry_run, raise_on_error, on_action=on_action)
    recursive = arguments.boolean(recursive, "recursive")
    list_of_files = arguments.optional_path(list_of_files, "list_of_files")
    env = arguments.env(env)
    progress = _progress(progress, subscribers)
    loc = parse_location(url)
    spec = RemoveSpec(loc, recursive, filters or Filters(), dry_run, config.max_concurrency,
                      Path(list_of_files) if list_of_files is not None else None, batch_enabled(env))
    return await _run(session, spec, config, env, progress, Hooks(on_action), raise_on_error)


remove_async = alone(remove_on)
remove = blocking_form(remove_async)


async def diagnose_async(url: str, *, write_test: bool = False, env: Mapping[str, str] | None = None,
                         timeout: float = 15.0, proxy: str | None = None, trusted_suffixes: Sequence[str] = ()
                         ) -> Diagnosis:
    """What `blobsync doctor` checks, as a Diagnosis: what the URL's credentials (its SAS, a key, Azure AD) allow
    and what each operation still lacks, which proxy the requests take, whether the endpoint answers and the
    container exists; with `write_test`, a probe blob put, read back and deleted."""
    from blobsync.backends.registry import Connection, diagnose

    url, env = arguments.url(url, "url"), arguments.env(env)
    arguments.boolean(write_test, "write_test")
    timeout = arguments.number(timeout, "timeout", 0.1, 3600, " seconds")
    arguments.optional(proxy, "proxy", str, "a proxy URL")
    if proxy is not None:
        check_proxy_url(proxy)
    connection = Connection(4, timeout, proxy, _suffixes(trusted_suffixes))
    return await diagnose(url, connection, env, write_test=write_test, timeout=timeout)


diagnose = blocking_form(diagnose_async)
