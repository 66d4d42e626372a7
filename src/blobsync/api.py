"""The public library's module functions: copy, sync, watch, resume and remove, each opening a Client for the one
call and calling it (blocking; async twins in blobsync.aio), and the jobs in the journal."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from blobsync import arguments, stopping
from blobsync.backends.base import BlobProperties, Location
from blobsync.backends.registry import parse_location
from blobsync.calls import (
    JobSummary,
    config_of,
    copy_on,
    job_id_of,
    journal_at,
    progress_of,
    remove_on,
    resume_on,
    sync_on,
    watch_on,
)
from blobsync.client import AsyncClient
from blobsync.config import TransferConfig, check_proxy_url
from blobsync.engine.context import RequestPath
from blobsync.engine.session import Session
from blobsync.errors import UsageError
from blobsync.events import Progress
from blobsync.journal import FileRow, JobRow, Journal

# Imported where used: `blobsync sync` (and `import blobsync`) then never load the doctor or sqlite-utils.
if TYPE_CHECKING:
    from blobsync.backends.diagnosis import Diagnosis
    from blobsync.journal.jobs import JobBook

__all__ = ["JobSummary", "clean_jobs", "copy", "copy_async", "diagnose", "diagnose_async", "list_blobs",
           "list_blobs_async", "list_jobs", "make_container", "make_container_async", "remove", "remove_async",
           "resume", "resume_async", "set_job_cap", "show_job", "sync", "sync_async", "watch", "watch_async"]
T = TypeVar("T")
P = ParamSpec("P")


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


def through_client(fn: Callable[Concatenate[Session, P], Coroutine[Any, Any, T]]
                   ) -> Callable[P, Coroutine[Any, Any, T]]:
    """The module function of a Client call (as httpx's module functions are): a Client opened for this call alone,
    on the call's config, environment, progress and journal, the call made on it, and the Client closed."""
    name = fn.__name__.removesuffix("_on")
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        given = signature.bind(None, *args, **kwargs).arguments  # a wrong argument: the TypeError a call gives
        config = config_of(given.get("config"))
        env = arguments.env(given.get("env"))
        journal_path = arguments.optional_path(given.get("journal_path"), "journal_path")  # resume's
        config = replace(config, journal_path=journal_path) if journal_path is not None else config
        progress = None
        if "progress" in signature.parameters:  # the call's Progress sees the bytes on the wire too
            progress = kwargs["progress"] = progress_of(given.get("progress"), given.get("subscribers", ()))
        journal = config.journal_path
        async with AsyncClient._for_call(config, env, progress, lambda: journal_at(journal, env)) as client:
            method: Callable[P, Coroutine[Any, Any, T]] = getattr(client, name)
            return await method(*args, **kwargs)

    call.__name__ = f"{name}_async"
    return call


def on_session(fn: Callable[Concatenate[Session, P], Coroutine[Any, Any, T]], session: Session | None
               ) -> Callable[P, T]:
    """The blocking form of a call run on `session` (`blobsync run`'s), or with None through a Client of its own,
    as the module function runs it (a command of its own)."""
    alone = through_client(fn)

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return _blocking(fn(session, *args, **kwargs) if session is not None else alone(*args, **kwargs))

    return run


def blocking_form(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking twin of an async library call, with its exact signature (so a type checker catches a
    misspelt keyword or a wrong type at the caller)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return _blocking(fn(*args, **kwargs))

    run.__doc__ = f"Blocking form of `blobsync.aio.{fn.__name__.removesuffix('_async')}`.\n\n{fn.__doc__ or ''}"
    return run


copy_async = through_client(copy_on)
copy = blocking_form(copy_async)
sync_async = through_client(sync_on)
sync = blocking_form(sync_async)
watch_async = through_client(watch_on)
watch = blocking_form(watch_async)  # run it in a thread beside a training loop, with stop=threading.Event()
resume_async = through_client(resume_on)
resume = blocking_form(resume_async)
remove_async = through_client(remove_on)
remove = blocking_form(remove_async)


def _suffixes(value: object) -> tuple[str, ...]:
    """trusted_suffixes as the library takes it: a sequence of host names or domains (or one ';'-joined text)."""
    from blobsync.config import parse_suffixes

    if isinstance(value, str):
        return parse_suffixes(value)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return parse_suffixes(";".join(value))
    raise UsageError(f"invalid trusted_suffixes={value!r}: a list of host names or domains")


def _book(journal: Journal) -> JobBook:
    from blobsync.journal.jobs import JobBook  # sqlite-utils: loaded by the `jobs` commands only

    return JobBook(journal)


def list_jobs(journal_path: Path | None = None, env: Mapping[str, str] | None = None) -> list[JobSummary]:
    with journal_at(journal_path, env) as journal:
        book = _book(journal)
        return [JobSummary(job, book.job_totals(job.id)) for job in book.list_jobs()]


def show_job(
    job_id: str | JobSummary | JobRow, journal_path: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[JobSummary, list[FileRow]]:
    with journal_at(journal_path, env) as journal:
        job, book = journal.get_job(job_id_of(job_id)), _book(journal)
        return JobSummary(job, book.job_totals(job.id)), book.files(job.id)


def set_job_cap(job_id: str, cap_mbps: float, journal_path: Path | None = None,
                env: Mapping[str, str] | None = None) -> JobRow:
    """Change the bandwidth cap of a job started with --cap-mbps; a running job applies it within a second, a
    resumed one starts with it. Returns the job."""
    arguments.number(cap_mbps, "cap_mbps", 0.001, 1_000_000, " Mbit/s")
    with journal_at(journal_path, env) as journal:
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
    with journal_at(journal_path, env) as journal:
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
    session = Session(config, env, lambda: journal_at(config.journal_path, env))
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
