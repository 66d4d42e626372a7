"""What every command shares: errors as one line and an exit code, logging, output options, running a job."""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import logging
import math
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

from blobsync._version import __version__
from blobsync.arguments import range_text
from blobsync.cli.output import JsonEvents, JsonLines, ProgressDisplay, summary, summary_record
from blobsync.engine.session import Session
from blobsync.errors import BlobsyncError, ExitCode, UsageError
from blobsync.events import Progress, Subscriber
from blobsync.filters import Filters
from blobsync.journal.store import damaged
from blobsync.redact import RedactingFilter, printable, redact, strip_query
from blobsync.report import Report
from blobsync.stopping import stop_on_signals

F = TypeVar("F", bound=Callable[..., Any])

# Where a command running with --output-type json keeps its JsonLines (in the invocation's click context, so
# that in-process runners calling several commands share nothing): a fatal error is a JSON line too.
_JSON_OUT = "blobsync.json_out"


class Finite(click.ParamType[float]):
    """A number flag: finite (no nan, no inf) and within a range stated as a person writes it."""

    name = "number"

    def __init__(self, lo: float, hi: float, unit: str = "") -> None:
        self.lo, self.hi, self.unit = lo, hi, unit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """The number, or a UsageError (one line, exit 2: cli.main reports it as every other usage error)."""
        name = (param.opts[0] if param.opts and param.opts[0].startswith("-") else (param.name or "").upper()) \
            if param is not None else "value"
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"invalid {name} {value!r}: use a number from "
                             f"{range_text(self.lo, self.hi, self.unit)}") from None
        if not (math.isfinite(number) and self.lo <= number <= self.hi):
            raise UsageError(f"{name} {value} is out of range: {range_text(self.lo, self.hi, self.unit)}")
        return number


def _json_out() -> JsonLines | None:
    ctx = click.get_current_context(silent=True)
    found = ctx.find_root().meta.get(_JSON_OUT) if ctx is not None else None
    return found if isinstance(found, JsonLines) else None


def run_session() -> Session | None:
    """The session `blobsync run FILE` runs its lines on (click's context object), or None: a command of its own."""
    context = click.get_current_context(silent=True)
    found = context.find_root().obj if context is not None else None
    return found if isinstance(found, Session) else None


def show_click_error(exc: click.ClickException) -> int:
    """click's own message for a bad flag, value or extra argument, as click prints it but with every secret
    removed (the argument it quotes may be a SAS URL); its exit code."""
    buf = io.StringIO()
    exc.show(file=buf)
    lines = buf.getvalue().splitlines()
    click.echo("\n".join(printable(redact(line)) for line in lines), err=True)
    return exc.exit_code


def fail(message: str, code: int) -> None:
    message = printable(redact(message))
    json_out = _json_out()
    if json_out is not None:
        json_out.emit({"type": "error", "message": message, "exit_code": code})
    click.echo(f"blobsync: error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: F) -> F:
    """Turn every expected failure into one line on stderr and its exit code: never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
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


_LEVELS = {"PANIC": "CRITICAL", "NONE": None}  # AzCopy's words; NONE logs nothing


def setup_logging(level: str, log_file: Path | None = None) -> None:
    """Logs go to stderr, or to `log_file`; never to stdout, where results and JSON lines go."""
    name = _LEVELS.get(level.upper(), level.upper())
    handler: logging.Handler = logging.StreamHandler(_log_stream(log_file) if log_file else sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("blobsync")
    root.handlers[:] = [handler]
    root.setLevel(name or logging.CRITICAL + 10)
    root.propagate = False



def _log_stream(log_file: Path) -> TextIO:
    """The log file, appended to: created 0600 (a log names files and hosts, and is no one else's to read), never
    through a link, and only a regular file of this user's (made 0600 again if it was more open)."""
    try:
        fd = os.open(log_file, os.O_CREAT | os.O_APPEND | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise click.BadParameter(f"cannot open {log_file}: {why}", param_hint="--log-file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
            raise click.BadParameter(f"cannot write to {log_file}: not a regular file of this user's",
                                     param_hint="--log-file")
        if st.st_mode & 0o077 and hasattr(os, "fchmod"):
            os.fchmod(fd, 0o600)
        return open(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def logging_options(fn: F) -> F:
    fn = click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                      help="Write logs to this file instead of stderr.")(fn)
    return click.option(
        "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "PANIC", "NONE"],
                                         case_sensitive=False),
        default="WARNING", show_default=True, help="Log detail (secrets are always redacted); NONE: no logs.",
    )(fn)


def exit_codes_option(fn: F) -> F:
    """--exit-codes: read by `main` from the command line (it maps the code the command exits with)."""
    return click.option(
        "--exit-codes", type=click.Choice(["blobsync", "azcopy"], case_sensitive=False), default=None,
        expose_value=False, help="azcopy: exit 0 or 1 only, as AzCopy does [default: $BLOBSYNC_EXIT_CODES, "
                                 "else blobsync's codes].")(fn)


@dataclass(frozen=True)
class OutputMode:
    """How a command shows what it does: text or JSON lines, the progress display, and how much of it."""

    json: bool = False
    interval: float | None = None
    quiet: bool = False  # no progress display
    silent: bool = False  # no summary either (AzCopy's --output-level quiet): errors only


def output_options(fn: F) -> F:
    """--output-type, --output-level, --progress-interval, --quiet (given to the command as `out`), the logging
    options and --exit-codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, output_type: str, output_level: str, progress_interval: float | None, quiet: bool,
                **kwargs: Any) -> Any:
        level = output_level.lower()
        out = OutputMode(output_type.lower() == "json", progress_interval, quiet or level != "default",
                         level == "quiet")
        return fn(*args, out=out, **kwargs)

    decorated: Any = exit_codes_option(logging_options(wrapper))
    decorated = click.option("--quiet", is_flag=True,
                             help="No progress display (results and the summary still print).")(decorated)
    decorated = click.option("--progress-interval", type=Finite(0.05, 3600, " seconds"), default=None,
                             help="Seconds between progress lines [default: 0.5 on a terminal, else 10].")(decorated)
    decorated = click.option(
        "--output-level", type=click.Choice(["default", "essential", "quiet"], case_sensitive=False),
        default="default", show_default=True,
        help="essential: no progress display; quiet: errors only (no summary either).")(decorated)
    return click.option(  # type: ignore[no-any-return]
        "--output-type", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
        show_default=True, help="json: stdout carries only JSON lines (start, files, progress, summary).",
    )(decorated)


def start_output(command: str, out: OutputMode, **fields: object) -> JsonLines | None:
    """In JSON mode, print the start record and route fatal errors to stdout as JSON too."""
    if not out.json:
        return None
    json_out = click.get_current_context().find_root().meta[_JSON_OUT] = JsonLines()
    shown = {k: strip_query(v) if isinstance(v, str) else v for k, v in fields.items()}
    json_out.emit({"type": "start", "command": command, "version": __version__,
                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **shown})
    return json_out


def run_command(call: Callable[[Progress], Report], out: OutputMode, *, json_out: JsonLines | None,
            dry_run: bool = False, show_files: bool = True, quiet: bool = False) -> None:
    """Run a job with its progress display, then print the summary and exit with the report's code."""
    subscribers: Sequence[Subscriber] = (JsonEvents(json_out),) if json_out is not None and show_files else ()
    progress = Progress(subscribers=subscribers)
    stop_on_signals()
    display = contextlib.nullcontext() if out.quiet or quiet else ProgressDisplay(progress, interval=out.interval,
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
    elif not out.silent:
        click.echo(summary(report, dry_run=dry_run))
    if report.files_failed and report.kind != "remove":
        click.echo(f"blobsync: {report.files_failed} file(s) failed; run the same command again (or "
                   f"'blobsync jobs resume {report.job_id}') to retry them", err=True)
    sys.exit(int(report.exit_code))


_FILTER_FLAGS = (
    ("--include-pattern", "Only file names matching these globs, 'a*.pt;*.h5'."),
    ("--exclude-pattern", "Skip file names matching these globs (excludes win over includes)."),
    ("--include-path", "Only these relative paths or folders, 'a/b;c'."),
    ("--exclude-path", "Skip relative paths starting with these, as AzCopy ('sub' also skips 'sub.pt'; 'sub/' "
                       "only the folder)."),
    ("--include-regex", "Only relative paths matching these regexes ('x;y')."),
    ("--exclude-regex", "Skip relative paths matching these regexes."),
    ("--include-after", "Only files modified on or after this ISO 8601 time."),
    ("--include-before", "Only files modified before or on this ISO 8601 time."),
)


def filter_options(fn: F) -> F:
    """The filter flags of cp, sync and rm, given to the command parsed, as `filters` (a bad one is a usage
    error before any request)."""
    names = [flag[2:].replace("-", "_") for flag, _ in _FILTER_FLAGS]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in names}
        return fn(*args, filters=Filters.parse(**given), **kwargs)

    decorated: Any = wrapper
    for flag, text in reversed(_FILTER_FLAGS):
        decorated = click.option(flag, default=None, help=text)(decorated)
    return decorated  # type: ignore[no-any-return]
