"""What every command shares: errors as one line and an exit code, logging, output options, running a job."""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from blobsync._version import __version__
from blobsync.cli.output import JsonEvents, JsonLines, ProgressDisplay, summary, summary_record
from blobsync.engine.context import Progress
from blobsync.errors import BlobsyncError, ExitCode
from blobsync.events import Subscriber
from blobsync.journal.store import damaged
from blobsync.redact import RedactingFilter, printable, redact, strip_query
from blobsync.report import Report
from blobsync.stopping import stop_on_signals

F = TypeVar("F", bound=Callable[..., Any])

# Set by a command running with --output-type json, so that a fatal error is a JSON line too.
_json_out: JsonLines | None = None


def fail(message: str, code: int) -> None:
    message = printable(redact(message))
    if _json_out is not None:
        _json_out.emit({"type": "error", "message": message, "exit_code": code})
    click.echo(f"blobsync: error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: F) -> F:
    """Turn every expected failure into one line on stderr and its exit code: never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _json_out
        _json_out = None  # until this command says otherwise (in-process runners call several commands)
        try:
            return fn(*args, **kwargs)
        except BlobsyncError as exc:
            fail(str(exc), int(exc.exit_code))
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}", int(ExitCode.PARTIAL))
        except sqlite3.Error as exc:  # the journal's pages are damaged: it showed only once read
            error = damaged(exc)
            fail(str(error), int(error.exit_code))
        return None

    return wrapper  # type: ignore[return-value]


def setup_logging(level: str, log_file: Path | None = None) -> None:
    """Logs go to stderr, or to `log_file`; never to stdout, where results and JSON lines go."""
    try:
        handler: logging.Handler = logging.FileHandler(log_file, encoding="utf-8") if log_file \
            else logging.StreamHandler(sys.stderr)
    except OSError as exc:
        raise click.BadParameter(f"cannot open {log_file}: {exc.strerror}", param_hint="--log-file") from exc
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("blobsync")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


proxy_option = click.option(
    "--proxy", default=None, metavar="URL",
    help="Proxy for every request, http://[user:password@]host:port [default: HTTPS_PROXY, HTTP_PROXY, "
         "ALL_PROXY, minus NO_PROXY].")


def logging_options(fn: F) -> F:
    fn = click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                      help="Write logs to this file instead of stderr.")(fn)
    return click.option(
        "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        default="WARNING", show_default=True, help="Log detail (secrets are always redacted).",
    )(fn)


def output_options(fn: F) -> F:
    """--output-type, --progress-interval, --quiet and the logging options."""
    fn = logging_options(fn)
    fn = click.option("--quiet", is_flag=True, help="No progress display (results and the summary still print).")(fn)
    fn = click.option("--progress-interval", type=click.FloatRange(min=0.05), default=None,
                      help="Seconds between progress lines [default: 0.5 on a terminal, else 10].")(fn)
    return click.option(
        "--output-type", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
        show_default=True, help="json: stdout carries only JSON lines (start, files, progress, summary).",
    )(fn)


def start_output(command: str, output_type: str, **fields: object) -> JsonLines | None:
    """In JSON mode, print the start record and route fatal errors to stdout as JSON too."""
    global _json_out
    if output_type.lower() != "json":
        return None
    _json_out = JsonLines()
    shown = {k: strip_query(v) if isinstance(v, str) else v for k, v in fields.items()}
    _json_out.emit({"type": "start", "command": command, "version": __version__,
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **shown})
    return _json_out


def run_job(call: Callable[[Progress], Report], *, quiet: bool, json_out: JsonLines | None,
            interval: float | None, dry_run: bool = False, show_files: bool = True) -> None:
    """Run a job with its progress display, then print the summary and exit with the report's code."""
    subscribers: Sequence[Subscriber] = (JsonEvents(json_out),) if json_out is not None and show_files else ()
    progress = Progress(subscribers=subscribers)
    stop_on_signals()
    display = contextlib.nullcontext() if quiet else ProgressDisplay(progress, interval=interval,
                                                                         json_out=json_out)
    try:
        with display:
            report = call(progress)
    except KeyboardInterrupt:
        job = progress.job_id
        hint = f"run the same command again, or 'blobsync jobs resume {job}'" if job else "run it again"
        message = f"interrupted; nothing is lost: {hint} to resume"
        if json_out is not None:
            json_out.emit({"type": "error", "message": message, "exit_code": int(ExitCode.INTERRUPTED)})
        click.echo(f"blobsync: {message}", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    if json_out is not None:
        json_out.emit(summary_record(report, dry_run=dry_run))
    else:
        click.echo(summary(report, dry_run=dry_run))
    if report.files_failed and report.kind != "remove":
        click.echo(f"blobsync: {report.files_failed} file(s) failed; run the same command again (or "
                   f"'blobsync jobs resume {report.job_id}') to retry them", err=True)
    sys.exit(int(report.exit_code))
