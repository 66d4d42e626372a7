"""The `blobsync` command: cp, sync, ls, rm, doctor and jobs; flags become a TransferConfig and library calls."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from blobsync import api, calls
from blobsync._version import __version__
from blobsync.cli.azcopy import AzCommand, azcopy_flags
from blobsync.cli.bench import bench
from blobsync.cli.blobs import ls, rm
from blobsync.cli.common import (
    Finite,
    OutputMode,
    exit_codes_option,
    fail,
    filter_options,
    handle_errors,
    logging_options,
    output_options,
    run_command,
    run_session,
    setup_logging,
    show_click_error,
    start_output,
)
from blobsync.cli.config_flags import config_from, config_option, transfer_options
from blobsync.cli.doctor import doctor
from blobsync.cli.output import JsonLines, human_bytes, summary, summary_record
from blobsync.cli.runfile import run
from blobsync.config import Overwrite, TransferConfig, parse_suffixes
from blobsync.engine.prompt import Answer
from blobsync.errors import BlobsyncError, ExitCode, UsageError
from blobsync.events import Progress
from blobsync.filters import Filters
from blobsync.jobs.compare import CompareMode
from blobsync.jobs.spec import Processes, check_cluster_address, parse_processes
from blobsync.jobs.sync import DeleteMode
from blobsync.journal import FileState, JobState
from blobsync.options import MaxDelete
from blobsync.redact import printable, redact, strip_query
from blobsync.report import Action, Report
from blobsync.stopping import stop_on_signals


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="blobsync")
def cli() -> None:
    """Fast, resumable, verified transfers between local disks and Azure Blob Storage."""


_cluster_option = click.option(
    "--cluster", default=None, is_flag=False, flag_value="", metavar="ADDRESS",
    help="Run the transfers on a Dask cluster: tcp://scheduler:8786, or local:N for N worker processes here; "
         "--cluster alone takes DASK_SCHEDULER_ADDRESS. The local side must be the same path on every worker. "
         "Needs pip install 'blobsync[dask]'.")


_processes_option = click.option(
    "--processes", default=None, metavar="N|auto",
    help="Run the transfers in N worker processes of blobsync's own on this machine (no Dask), for jobs that one "
         "process's CPU bounds: many small files, or a large file cut into block ranges where a core is left for "
         "them; auto: one per core where there are at least 4, else 1.")


def _cluster(address: str | None, processes: str | None = None) -> str | Processes | None:
    """--cluster's address or --processes' count as the job's cluster (None: this process only); --cluster
    needs the extra installed."""
    if processes is not None:
        if address is not None:
            raise UsageError("choose one of --cluster and --processes")
        count = parse_processes(processes)
        if count < 2:
            return None
        from blobsync.cluster.processes import prestart

        return Processes(count, started=prestart(count))
    if address is None:
        return None
    if not address:
        address = os.environ.get("DASK_SCHEDULER_ADDRESS", "")
        if not address:
            raise UsageError("--cluster without an address takes DASK_SCHEDULER_ADDRESS, which is not set",
                             hint="pass --cluster tcp://scheduler:8786 or --cluster local:N")
    from blobsync.cluster.dask_adapter import require_dask

    check_cluster_address(address)
    require_dask()
    return address


def _ask_overwrite(description: str) -> Answer:
    """--overwrite prompt, on the terminal: AzCopy's y/n/A/N."""
    while True:
        reply = click.prompt(f"{printable(description)}: overwrite? y (yes), n (no), A (all), N (none)",
                             default="n", show_default=False, err=True).strip()
        answer = {"y": Answer.YES, "yes": Answer.YES, "n": Answer.NO, "no": Answer.NO, "A": Answer.ALL,
                  "all": Answer.ALL, "N": Answer.NONE, "none": Answer.NONE}.get(reply)
        if answer is not None:
            return answer


def _echo_action(out: OutputMode, json_out: JsonLines | None, dry_run: bool) -> Callable[[Action], None]:
    def on_action(action: Action) -> None:
        if json_out is not None:
            json_out.emit({"type": "action", "action": action.kind, "path": action.path,
                           "reason": action.reason, "size": action.size, "dry_run": dry_run})
        elif dry_run and not out.silent:
            click.echo(f"{action.kind:<8} {printable(action.path)}  ({printable(action.reason)})")

    return on_action


@cli.command(cls=AzCommand)
@handle_errors  # outermost: the option wrappers below raise usage errors too
@click.argument("source")
@click.argument("destination")
@click.option("-r", "--recursive", is_flag=True,
              help="Copy a folder (or every blob under a prefix); it becomes a level under the destination, as "
                   "in AzCopy (see --as-subdir).")
@click.option("--as-subdir/--no-as-subdir", default=True, show_default=True,
              help="With -r: the source folder's (or prefix's) name is a level under the destination; "
                   "--as-subdir=false (or a source ending in '/*') copies the contents only.")
@click.option("--overwrite", type=click.Choice(["true", "false", "ifSourceNewer", "prompt"], case_sensitive=False),
              default="true", show_default=True, help="What to do when the destination exists (prompt: ask).")
@click.option("--preserve-last-modified-time", is_flag=True,
              help="Downloads: set the file's mtime to the source's (stored by blobsync, else Last-Modified).")
@_cluster_option
@_processes_option
@click.option("--dry-run", is_flag=True, help="Print what would be copied, and where; copy nothing.")
@click.option("--list-of-files", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A file of paths relative to the source, one per line (files, or folders with all below them): "
                   "copy those (implies -r).")
@filter_options
@transfer_options
@azcopy_flags("copy")
@output_options
def cp(source: str, destination: str, as_subdir: bool, dry_run: bool, filters: Filters, cluster: str | None,
       processes: str | None, list_of_files: Path | None, out: OutputMode, log_level: str, log_file: Path | None,
       **options: Any) -> None:
    """Copy SOURCE to DESTINATION: a local path and a blob URL, either way, or two blob URLs.

    Upload a file (or a folder with -r) to a container or blob URL, download a blob (or everything under a
    prefix with -r) to a local path, or copy between two URLs (the destination's service reads the source). A last
    segment with '*' picks entries at that level ('./ckpt/*.pt', '<url>/run1/*'). Interrupted? Run the same
    command again: only what is missing is sent.
    """
    setup_logging(log_level, log_file)
    config = config_from(options)
    address = _cluster(cluster, processes)
    prompt = config.overwrite is Overwrite.PROMPT and not dry_run
    if prompt and not sys.stdin.isatty():
        raise UsageError("--overwrite prompt needs a terminal to ask on: use true, false or ifSourceNewer")
    json_out = start_output("cp", out, source=source, destination=destination, dry_run=dry_run)
    on_action = _echo_action(out, json_out, dry_run)
    copy = api.on_session(calls.copy_on, run_session())
    run_command(lambda progress: copy(source, destination, config, progress=progress, filters=filters,
                                  as_subdir=as_subdir, dry_run=dry_run, on_action=on_action,
                                  confirm_overwrite=_ask_overwrite if prompt else None, cluster=address,
                                  list_of_files=list_of_files),
            out, json_out=json_out, dry_run=dry_run, show_files=not dry_run, quiet=dry_run or prompt)


@cli.command(cls=AzCommand)
@handle_errors  # outermost: the option wrappers below raise usage errors too
@click.argument("source")
@click.argument("destination")
@click.option("--recursive/--no-recursive", default=True, show_default=True,
              help="Sync sub-folders too; --recursive=false syncs only the files at the top (as AzCopy).")
@filter_options
@click.option("--compare-hash", type=click.Choice(["none", "md5"], case_sensitive=False), default="none",
              show_default=True, help="md5: compare content hashes (local hashes are cached in the journal).")
@click.option("--size-only", is_flag=True, help="Compare sizes only.")
@click.option("--mirror-mode", is_flag=True, help="Transfer every file, whatever the destination has.")
@click.option("--delete-destination", type=click.Choice(["true", "false", "prompt"], case_sensitive=False),
              default="false", show_default=True,
              help="Delete destination files the source no longer has (never ones the filters exclude).")
@click.option("--max-delete", default=None, help="Delete nothing if more than N (or N%) would be deleted.")
@_cluster_option
@_processes_option
@click.option("--dry-run", is_flag=True, help="Print what would be done, and why; change nothing.")
@click.option("--watch", is_flag=True,
              help="Uploads: after the first sync, keep syncing files as they change, until Ctrl-C.")
@click.option("--settle", type=Finite(0, 86400, " seconds"), default=2.0, show_default=True,
              help="With --watch: send a file only once it has not been modified for this many seconds.")
@transfer_options
@azcopy_flags("sync")
@output_options
def sync(source: str, destination: str, recursive: bool, filters: Filters, compare_hash: str, size_only: bool,
         mirror_mode: bool, delete_destination: str, max_delete: str | None, dry_run: bool, watch: bool,
         settle: float, cluster: str | None, processes: str | None, out: OutputMode, log_level: str,
         log_file: Path | None, **options: Any) -> None:
    """Make DESTINATION match SOURCE: a local folder and a container URL (with an optional prefix), either way.

    Files that are new, differ in size, or are newer at the source are transferred; with --delete-destination,
    files only the destination has are deleted once everything else succeeded. Run it again: nothing moves.
    With --watch (local folder to URL), it then keeps syncing what changes, each file once it has settled.
    """
    setup_logging(log_level, log_file)
    if sum((compare_hash.lower() == "md5", size_only, mirror_mode)) > 1:
        raise UsageError("choose one of --compare-hash md5, --size-only and --mirror-mode")
    if not recursive:
        filters = filters.narrowed(recursive=False)
    compare = (CompareMode.MD5 if compare_hash.lower() == "md5" else CompareMode.SIZE_ONLY if size_only
               else CompareMode.MIRROR if mirror_mode else CompareMode.SIZE_AND_MTIME)
    delete = DeleteMode.parse(delete_destination)
    limit = MaxDelete.parse(max_delete)  # read once: a bad value is a usage error before any work
    config = config_from(options, recursive=True)
    address = _cluster(cluster, processes)
    if watch and address is not None:
        raise UsageError("--cluster and --processes cannot be used with --watch: a watch sends each file as it "
                         "settles, here")
    json_out = start_output("sync", out, source=source, destination=destination, dry_run=dry_run,
                            watch=watch)
    if watch:
        if dry_run:
            raise UsageError("--dry-run cannot be used with --watch")
        _run_watch(source, destination, config, settle=settle, filters=filters, compare=compare, delete=delete,
                   max_delete=limit, json_out=json_out)
        return
    on_action = _echo_action(out, json_out, dry_run)

    def confirm(count: int) -> bool:
        return click.confirm(f"delete {count} file(s) at the destination that the source no longer has?",
                             default=False, err=True)

    def call(progress: Progress) -> Report:
        sync = api.on_session(calls.sync_on, run_session())
        return sync(source, destination, config, filters=filters, compare=compare, delete=delete,
                    max_delete=limit, dry_run=dry_run, progress=progress, on_action=on_action,
                    confirm=confirm, cluster=address)

    run_command(call, out, json_out=json_out, dry_run=dry_run, show_files=not dry_run, quiet=dry_run)


def _run_watch(source: str, destination: str, config: TransferConfig, *, settle: float, filters: Filters,
               compare: CompareMode, delete: DeleteMode, max_delete: MaxDelete | None, json_out: JsonLines | None
               ) -> None:
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


_journal_option = config_option("journal_path")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


@jobs.command("list")
@_journal_option
@handle_errors
def jobs_list(journal_path: Path | None) -> None:
    """One line per job: id, state, when, files, source and destination."""
    setup_logging("WARNING")  # a row it cannot read is named on stderr, and the others listed
    summaries = api.list_jobs(journal_path)
    if not summaries:
        click.echo("no jobs")
        return
    for s in summaries:
        files = sum(t["files"] for t in s.totals.values())
        done = s.totals.get(FileState.COMMITTED, {}).get("files", 0)
        click.echo(f"{s.job.id}  {s.job.state:<11} {_when(s.job.updated)}  {done}/{files} files  "
                   f"{s.job.source} -> {s.job.dest}")


@jobs.command("cap")
@click.argument("job_id")
@click.argument("mbps", type=Finite(0.001, 1_000_000, " Mbit/s"))
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
def jobs_resume(job_id: str, sas: str | None, journal_path: Path | None, out: OutputMode, log_level: str,
                log_file: Path | None) -> None:
    """Resume a job; credentials come from --sas or the environment."""
    setup_logging(log_level, log_file)
    job = api.show_job(job_id, journal_path)[0].job
    if job.state is JobState.DONE:
        click.echo(f"job {job.id} is already done: nothing to resume")
        return
    json_out = start_output("jobs resume", out, job=job_id)
    prompt = sys.stdin.isatty()
    resume = api.on_session(calls.resume_on, run_session())
    run_command(lambda progress: resume(job_id, sas=sas, journal_path=journal_path, progress=progress,
                                    confirm_overwrite=_ask_overwrite if prompt else None),
            out, json_out=json_out)


@jobs.command("clean")
@click.option("--older-than", "older_than", type=Finite(0, 36500, " days"), default=None,
              help="Only jobs older than DAYS.")
@click.option("--all", "include_unfinished", is_flag=True, help="Also forget unfinished (resumable) jobs.")
@_journal_option
@handle_errors
def jobs_clean(older_than: float | None, include_unfinished: bool, journal_path: Path | None) -> None:
    """Forget finished jobs from the journal."""
    removed = api.clean_jobs(older_than, include_unfinished=include_unfinished, journal_path=journal_path)
    click.echo(f"removed {len(removed)} job(s)")


@cli.command(cls=AzCommand)
@handle_errors  # outermost: the option wrappers below raise usage errors too
@click.argument("url")
@config_option("proxy")
@config_option("max_retries")
@config_option("trusted_suffixes")
@click.option("--output-type", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
              show_default=True, help="json: one JSON line with the outcome.")
@click.option("--output-level", type=click.Choice(["default", "essential", "quiet"], case_sensitive=False),
              default="default", help="quiet: print nothing on success.")
@azcopy_flags("make")
@logging_options
@exit_codes_option
def make(url: str, proxy: str | None, max_retries: int, trusted_suffixes: str | None, output_type: str,
         output_level: str, log_level: str, log_file: Path | None) -> None:
    """Create the container URL names (AzCopy's make); one that exists already is an error (exit 1)."""
    setup_logging(log_level, log_file)
    created = api.make_container(url, max_retries=max_retries, proxy=proxy,
                                 trusted_suffixes=parse_suffixes(trusted_suffixes))
    if not created:
        raise BlobsyncError(f"the container {strip_query(url)!r} already exists")
    if output_type.lower() == "json":
        JsonLines().emit({"type": "summary", "created": strip_query(url), "exit_code": 0})
    elif output_level.lower() != "quiet":
        click.echo(f"Successfully created the container {strip_query(url)}")


cli.add_command(ls)
cli.add_command(rm)
cli.add_command(doctor)
cli.add_command(run)
cli.add_command(bench)
# AzCopy's own names, so that a script changes only the program's name.
cli.add_command(cp, "copy")
cli.add_command(rm, "remove")
cli.add_command(ls, "list")


def _azcopy_exit_codes(argv: list[str], env: Mapping[str, str]) -> bool:
    """--exit-codes azcopy (on the command line, before any '--') or BLOBSYNC_EXIT_CODES=azcopy."""
    args = argv[:argv.index("--")] if "--" in argv else argv
    for i, arg in enumerate(args):
        if arg.startswith("--exit-codes="):
            return arg.split("=", 1)[1].lower() == "azcopy"
        if arg == "--exit-codes" and i + 1 < len(args):
            return args[i + 1].lower() == "azcopy"
    return env.get("BLOBSYNC_EXIT_CODES", "").lower() == "azcopy"


def main() -> None:
    # A transfer allocates many short-lived objects (requests, futures, listing entries) and little cyclic
    # garbage; at the default gen-0 threshold (700) the collector ran every few files and rescanned what the imports
    # had built. Measured: 2,000 small files, 1.08-1.30 -> 0.98 s of CPU. Only the command does this; the library
    # leaves its host's collector alone.
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    gc.enable()  # off while the modules loaded (cli.entry)
    azcopy_codes = _azcopy_exit_codes(sys.argv[1:], os.environ)
    try:
        try:
            # Not click's standalone mode: its own messages quote the arguments (a SAS URL among them), so they
            # are printed here, through the redaction like every other line.
            cli.main(prog_name="blobsync", standalone_mode=False)
        except BlobsyncError as exc:  # raised while click parsed a flag (a Finite number), before any command
            fail(str(exc), int(exc.exit_code))
        except click.ClickException as exc:
            sys.exit(show_click_error(exc))
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        # AzCopy exits 0 or 1: scripts written for it test `== 1`; blobsync's finer codes are in docs/cli.md.
        sys.exit(min(code, 1) if azcopy_codes else code)
