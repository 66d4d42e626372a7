"""The `blobsync` command: cp, sync, ls, rm, doctor and jobs; flags become a TransferConfig and library calls."""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path
from typing import Any

import click

from blobsync import api
from blobsync._version import __version__
from blobsync.cli.common import (
    F,
    handle_errors,
    output_options,
    proxy_option,
    run_job,
    setup_logging,
    start_output,
)
from blobsync.cli.doctor import doctor
from blobsync.cli.listing import ls, rm
from blobsync.cli.output import JsonLines, human_bytes, summary, summary_record
from blobsync.config import TIERS, CheckMd5, Overwrite, TransferConfig, parse_concurrency, parse_metadata
from blobsync.engine.context import Progress
from blobsync.errors import BlobsyncError, ExitCode, UsageError
from blobsync.redact import printable, redact
from blobsync.report import Report
from blobsync.stopping import stop_on_signals
from blobsync.syncing.compare import CompareMode
from blobsync.syncing.filters import Filters
from blobsync.syncing.job import Action, DeleteMode, parse_max_delete


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="blobsync")
def cli() -> None:
    """Fast, resumable, verified transfers between local disks and Azure Blob Storage."""


def _transfer_options(fn: F) -> F:
    """Options shared by cp and sync; they arrive as keyword arguments and become a TransferConfig."""
    options = [
        click.option("--block-size-mb", type=float, default=8, show_default=True,
                     help="Block (upload) or range (download) size; raised so no blob needs over 50,000 blocks."),
        click.option("--put-blob-size-mb", type=float, default=None,
                     help="Files up to this size go in one request [default: the block size]."),
        click.option("--concurrency", default="auto", show_default=True,
                     help="Requests in flight, shared by all files: 'auto' (tuned to the link, up to 64) or a "
                          "fixed ceiling N."),
        click.option("--memory-mb", type=float, default=256, show_default=True,
                     help="Bytes in flight (buffers), shared by all files."),
        click.option("--put-md5/--no-put-md5", default=True, show_default=True,
                     help="Uploads: store the whole-file MD5 as the blob's Content-MD5 (blocks carry their own)."),
        click.option("--check-md5",
                     type=click.Choice(["NoCheck", "LogOnly", "FailIfDifferent", "FailIfDifferentOrMissing"],
                                       case_sensitive=False),
                     default="FailIfDifferent", show_default=True,
                     help="Downloads: compare the bytes' MD5 with the blob's Content-MD5."),
        click.option("--content-type", default=None, help="Content type [default: guessed from the file name]."),
        click.option("--metadata", default=None, help="Blob metadata, 'key=value;key2=value2'."),
        click.option("--block-blob-tier", type=click.Choice(TIERS, case_sensitive=False), default=None,
                     help="Access tier for uploaded blobs."),
        click.option("--create-container", is_flag=True, help="Create the container if it does not exist."),
        click.option("--follow-symlinks", is_flag=True,
                     help="Follow symbolic links (default: skip them with a note)."),
        click.option("--journal", "journal_path", type=click.Path(path_type=Path), default=None,
                     help="Journal database [default: $XDG_STATE_HOME/blobsync/journal.db]."),
        click.option("--max-retries", type=int, default=8, show_default=True, help="Retries per request."),
        click.option("--retry-deadline", type=float, default=900, show_default=True,
                     help="Seconds after which a request stops retrying."),
        click.option("--cap-mbps", type=float, default=None,
                     help="Cap the job's bandwidth, in megabits per second (all connections, both directions)."),
        proxy_option,
        click.option("--stall-timeout", type=float, default=120, show_default=True,
                     help="Seconds without progress (request body or response) before a request is aborted "
                          "and retried."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _config(*, recursive: bool, overwrite: str = "true", preserve_last_modified_time: bool = False,
            block_size_mb: float, put_blob_size_mb: float | None, memory_mb: float, concurrency: str,
            put_md5: bool, check_md5: str, content_type: str | None, metadata: str | None,
            block_blob_tier: str | None, create_container: bool, follow_symlinks: bool, journal_path: Path | None,
            max_retries: int, retry_deadline: float, stall_timeout: float,
            cap_mbps: float | None, proxy: str | None) -> TransferConfig:
    tier = next((t for t in TIERS if block_blob_tier and t.lower() == block_blob_tier.lower()), None)
    return TransferConfig.from_mib(
        block_size_mb=block_size_mb,
        put_blob_size_mb=put_blob_size_mb,
        memory_mb=memory_mb,
        concurrency=parse_concurrency(concurrency),
        overwrite=Overwrite.parse(overwrite),
        put_md5=put_md5,
        check_md5=CheckMd5.parse(check_md5),
        preserve_last_modified_time=preserve_last_modified_time,
        content_type=content_type,
        metadata=parse_metadata(metadata),
        tier=tier,
        create_container=create_container,
        recursive=recursive,
        follow_symlinks=follow_symlinks,
        journal_path=journal_path,
        max_retries=max_retries,
        retry_deadline=retry_deadline,
        stall_timeout=stall_timeout,
        cap_mbps=cap_mbps,
        proxy=proxy,
    )


@cli.command()
@click.argument("source")
@click.argument("destination")
@click.option("-r", "--recursive", is_flag=True,
              help="Upload a folder's contents, or download every blob under a prefix (names = relative paths).")
@click.option("--overwrite", type=click.Choice(["true", "false", "ifSourceNewer"], case_sensitive=False),
              default="true", show_default=True, help="What to do when the destination exists.")
@click.option("--preserve-last-modified-time", is_flag=True,
              help="Downloads: set the file's mtime to the source's (stored by blobsync, else Last-Modified).")
@_transfer_options
@output_options
@handle_errors
def cp(source: str, destination: str, output_type: str, progress_interval: float | None, quiet: bool,
       log_level: str, log_file: Path | None, **options: Any) -> None:
    """Copy SOURCE to DESTINATION; one of them is a blob URL, the other a local path.

    Upload a file (or a folder with -r) to a container or blob URL, or download a blob (or everything under a
    prefix with -r) to a local path. Interrupted? Run the same command again: only what is missing is sent.
    """
    setup_logging(log_level, log_file)
    config = _config(**options)
    json_out = start_output("cp", output_type, source=source, destination=destination)
    run_job(lambda progress: api.copy(source, destination, config, progress=progress), quiet=quiet,
            json_out=json_out, interval=progress_interval)


@cli.command()
@click.argument("source")
@click.argument("destination")
@click.option("--include-pattern", default=None, help="Only file names matching these globs, 'a*.pt;*.h5'.")
@click.option("--exclude-pattern", default=None, help="Skip file names matching these globs (wins over includes).")
@click.option("--include-path", default=None, help="Only these relative paths or folders, 'a/b;c'.")
@click.option("--exclude-path", default=None, help="Skip these relative paths or folders.")
@click.option("--include-regex", default=None, help="Only relative paths matching these regexes ('x;y').")
@click.option("--exclude-regex", default=None, help="Skip relative paths matching these regexes.")
@click.option("--include-after", default=None, help="Only files modified at or after this ISO 8601 time.")
@click.option("--include-before", default=None, help="Only files modified before this ISO 8601 time.")
@click.option("--compare-hash", type=click.Choice(["none", "md5"], case_sensitive=False), default="none",
              show_default=True, help="md5: compare content hashes (local hashes are cached in the journal).")
@click.option("--size-only", is_flag=True, help="Compare sizes only.")
@click.option("--mirror-mode", is_flag=True, help="Transfer every file, whatever the destination has.")
@click.option("--delete-destination", type=click.Choice(["true", "false", "prompt"], case_sensitive=False),
              default="false", show_default=True,
              help="Delete destination files the source no longer has (never ones the filters exclude).")
@click.option("--max-delete", default=None, help="Delete nothing if more than N (or N%) would be deleted.")
@click.option("--dry-run", is_flag=True, help="Print what would be done, and why; change nothing.")
@click.option("--watch", is_flag=True,
              help="Uploads: after the first sync, keep syncing files as they change, until Ctrl-C.")
@click.option("--settle", type=float, default=2.0, show_default=True,
              help="With --watch: send a file only once it has not been modified for this many seconds.")
@_transfer_options
@output_options
@handle_errors
def sync(source: str, destination: str, include_pattern: str | None, exclude_pattern: str | None,
         include_path: str | None, exclude_path: str | None, include_regex: str | None, exclude_regex: str | None,
         include_after: str | None, include_before: str | None, compare_hash: str, size_only: bool,
         mirror_mode: bool, delete_destination: str, max_delete: str | None, dry_run: bool, output_type: str,
         watch: bool, settle: float, progress_interval: float | None, quiet: bool, log_level: str,
         log_file: Path | None, **options: Any) -> None:
    """Make DESTINATION match SOURCE: a local folder and a container URL (with an optional prefix), either way.

    Files that are new, differ in size, or are newer at the source are transferred; with --delete-destination,
    files only the destination has are deleted once everything else succeeded. Run it again: nothing moves.
    With --watch (local folder to URL), it then keeps syncing what changes, each file once it has settled.
    """
    setup_logging(log_level, log_file)
    if sum((compare_hash.lower() == "md5", size_only, mirror_mode)) > 1:
        raise UsageError("choose one of --compare-hash md5, --size-only and --mirror-mode")
    filters = Filters.parse(
        include_pattern=include_pattern, exclude_pattern=exclude_pattern, include_path=include_path,
        exclude_path=exclude_path, include_regex=include_regex, exclude_regex=exclude_regex,
        include_after=include_after, include_before=include_before,
    )
    compare = (CompareMode.MD5 if compare_hash.lower() == "md5" else CompareMode.SIZE_ONLY if size_only
               else CompareMode.MIRROR if mirror_mode else CompareMode.SIZE_AND_MTIME)
    delete = DeleteMode.parse(delete_destination)
    parse_max_delete(max_delete)  # a bad value is a usage error before any work
    config = _config(recursive=True, **options)
    json_out = start_output("sync", output_type, source=source, destination=destination, dry_run=dry_run,
                            watch=watch)
    if watch:
        if dry_run:
            raise UsageError("--dry-run cannot be used with --watch")
        _run_watch(source, destination, config, settle=settle, filters=filters, compare=compare, delete=delete,
                   max_delete=max_delete, json_out=json_out)
        return

    def on_action(action: Action) -> None:
        if json_out is not None:
            json_out.emit({"type": "action", "action": action.kind, "path": action.path,
                           "reason": action.reason, "size": action.size, "dry_run": dry_run})
        elif dry_run:
            click.echo(f"{action.kind:<8} {printable(action.path)}  ({printable(action.reason)})")

    def confirm(count: int) -> bool:
        return click.confirm(f"delete {count} file(s) at the destination that the source no longer has?",
                             default=False, err=True)

    def call(progress: Progress) -> Report:
        return api.sync(source, destination, config, filters=filters, compare=compare, delete=delete,
                        max_delete=max_delete, dry_run=dry_run, progress=progress, on_action=on_action,
                        confirm=confirm)

    run_job(call, quiet=quiet or dry_run, json_out=json_out, interval=progress_interval, dry_run=dry_run,
            show_files=not dry_run)


def _run_watch(source: str, destination: str, config: TransferConfig, *, settle: float, filters: Filters,
               compare: CompareMode, delete: DeleteMode, max_delete: str | None, json_out: JsonLines | None) -> None:
    """sync --watch: one summary per round that did something; Ctrl-C (or SIGTERM) stops, resumable."""

    rounds = 0

    def on_round(report: Report) -> None:
        nonlocal rounds
        rounds += 1
        if json_out is not None:
            json_out.emit(summary_record(report))
        elif report.files_transferred or report.files_failed or report.files_deleted or rounds == 1:
            click.echo(summary(report))
        if rounds == 1:
            click.echo(f"watching {source} (settle {settle:g}s); Ctrl-C to stop", err=True)

    def on_error(exc: BlobsyncError, delay: float) -> None:
        click.echo(f"blobsync: {redact(str(exc))}; retrying in {delay:.0f}s", err=True)

    stop_on_signals()
    try:
        api.watch(source, destination, config, settle=settle, filters=filters, compare=compare, delete=delete,
                  max_delete=max_delete, on_round=on_round, on_error=on_error)
    except KeyboardInterrupt:
        click.echo("blobsync: stopped watching; a file cut short resumes from its staged blocks on the next run",
                   err=True)
        sys.exit(int(ExitCode.INTERRUPTED))


@cli.group()
def jobs() -> None:
    """List, inspect, resume and clean journaled jobs."""


_journal_option = click.option("--journal", "journal_path", type=click.Path(path_type=Path), default=None,
                               help="Journal database [default: $XDG_STATE_HOME/blobsync/journal.db].")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


@jobs.command("list")
@_journal_option
@handle_errors
def jobs_list(journal_path: Path | None) -> None:
    """One line per job: id, state, when, files, source and destination."""
    summaries = api.list_jobs(journal_path)
    if not summaries:
        click.echo("no jobs")
        return
    for s in summaries:
        files = sum(t["files"] for t in s.totals.values())
        done = s.totals.get("committed", {}).get("files", 0)
        click.echo(f"{s.job.id}  {s.job.state:<11} {_when(s.job.updated)}  {done}/{files} files  "
                   f"{s.job.source} -> {s.job.dest}")


@jobs.command("cap")
@click.argument("job_id")
@click.argument("mbps", type=float)
@_journal_option
@handle_errors
def jobs_cap(job_id: str, mbps: float, journal_path: Path | None) -> None:
    """Change the bandwidth cap (megabits per second) of a job started with --cap-mbps, while it runs."""
    job = api.set_job_cap(job_id, mbps, journal_path)
    state = "applies within a second" if job.state == "running" else f"applies when it resumes ({job.state} now)"
    click.echo(f"job {job.id}: cap {mbps:g} Mbit/s, {state}")


@jobs.command("show")
@click.argument("job_id")
@_journal_option
@handle_errors
def jobs_show(job_id: str, journal_path: Path | None) -> None:
    """Per-file state and bytes of one job."""
    s, files = api.show_job(job_id, journal_path)
    click.echo(f"job {s.job.id}: {s.job.kind} {s.job.state}, started {_when(s.job.created)}, "
               f"updated {_when(s.job.updated)}")
    click.echo(f"  {s.job.source} -> {s.job.dest}")
    for state, t in sorted(s.totals.items()):
        click.echo(f"  {state}: {t['files']} files, {human_bytes(t['bytes'])}")
    for f in files:
        line = f"  {f.state:<9} {human_bytes(f.bytes_sent):>11} / {human_bytes(f.size):<11} {f.rel}"
        if f.error:
            line += f"  ({f.error})"
        click.echo(line)


@jobs.command("resume")
@click.argument("job_id")
@click.option("--sas", default=None, help="SAS token for the destination (the journal never stores one).")
@_journal_option
@output_options
@handle_errors
def jobs_resume(job_id: str, sas: str | None, journal_path: Path | None, output_type: str,
                progress_interval: float | None, quiet: bool, log_level: str, log_file: Path | None) -> None:
    """Resume a job; credentials come from --sas or the environment."""
    setup_logging(log_level, log_file)
    json_out = start_output("jobs resume", output_type, job=job_id)
    run_job(lambda progress: api.resume(job_id, sas=sas, journal_path=journal_path, progress=progress),
            quiet=quiet, json_out=json_out, interval=progress_interval)


@jobs.command("clean")
@click.option("--older-than", "older_than", type=float, default=None, help="Only jobs older than DAYS.")
@click.option("--all", "include_unfinished", is_flag=True, help="Also forget unfinished (resumable) jobs.")
@_journal_option
@handle_errors
def jobs_clean(older_than: float | None, include_unfinished: bool, journal_path: Path | None) -> None:
    """Forget finished jobs from the journal."""
    removed = api.clean_jobs(older_than, include_unfinished=include_unfinished, journal_path=journal_path)
    click.echo(f"removed {len(removed)} job(s)")


cli.add_command(ls)
cli.add_command(rm)
cli.add_command(doctor)


def main() -> None:
    # A transfer allocates many short-lived objects (requests, futures, listing entries) and little cyclic
    # garbage; at the default gen-0 threshold (700) the collector ran every few files and rescanned what the imports
    # had built. Measured: 2,000 small files, 1.08-1.30 -> 0.98 s of CPU. Only the command does this; the library
    # leaves its host's collector alone.
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    cli(prog_name="blobsync")
