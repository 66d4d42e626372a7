"""`blobsync run FILE`: many commands, one per line, in one process and one session (s5cmd style)."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from blobsync import stopping
from blobsync.cli.common import handle_errors, output_options, setup_logging, show_click_error
from blobsync.cli.config_flags import config_from, config_options
from blobsync.cli.output import JsonLines
from blobsync.config import session_fields
from blobsync.engine.session import Session
from blobsync.errors import ExitCode, UsageError
from blobsync.events import Progress
from blobsync.journal import Journal, default_journal_path

# What a line may run: the transfer and listing commands (AzCopy's names too). Not run itself, jobs or doctor.
RUNNABLE = frozenset(("cp", "copy", "sync", "rm", "remove", "ls", "list", "make"))
MAX_LINE = 65_536  # characters in one line of a `blobsync run` file: a long list of names belongs in --list-of-files


def _lines(source: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, arguments) of each command in the file ('-': standard input); blanks and # comments skipped."""
    try:
        text = sys.stdin.read() if str(source) == "-" else source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"cannot read {str(source)!r}: {reason}") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE:  # shlex takes time growing with the square of a line's length
            raise UsageError(f"{source}:{number}: a line of {len(line):,} characters; the limit is {MAX_LINE:,}",
                             hint="put long lists of files in a file named by --list-of-files")
        try:
            args = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UsageError(f"{source}:{number}: {exc} (quote arguments as a shell would)") from exc
        if args and args[0] == "blobsync":
            args = args[1:]
        if args:
            yield number, args


def _check(number: int, args: list[str]) -> None:
    if args[0] not in RUNNABLE:
        raise UsageError(f"line {number}: {args[0]!r} cannot be run from a file: use "
                         f"{', '.join(sorted(RUNNABLE))}")


def _one(args: list[str], json: bool, session: Session) -> int:
    """Run one command line in this process, on `session`; its exit code."""
    from blobsync.cli.main import cli

    if json and not any(a.startswith("--output-type") for a in args):
        args = [*args, "--output-type", "json"]
    try:
        cli.main(args, prog_name="blobsync", standalone_mode=False, obj=session)  # see common.run_session
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(ExitCode.PARTIAL)
    except click.exceptions.Abort:
        return int(ExitCode.INTERRUPTED)
    except click.ClickException as exc:
        return show_click_error(exc)
    return 0


@click.command("run")
@handle_errors
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@config_options(session_fields())
@output_options
def run(file: Path, out: Any, log_level: str, log_file: Path | None, **options: Any) -> None:
    """Run the commands FILE holds, one per line ('-': standard input), in this one process.

    Each line is a blobsync command (cp, sync, rm, ls, make; a leading 'blobsync' is allowed), quoted as in a
    shell. All share one session: connections, credentials, the journal, and the session settings given here
    (concurrency, memory, the bandwidth cap, retries, timeouts, proxy, trusted hosts), which every line takes
    unless it sets one itself (then that line runs on a session of its own). Every line runs, whatever the one
    before did; the exit code is the worst of theirs. With --output-type json, each line's JSON lines are
    followed by one {"type": "run"} record.
    """
    setup_logging(log_level, log_file)
    config = config_from(options)
    commands = list(_lines(file))
    for number, args in commands:
        _check(number, args)
    json_out = JsonLines() if out.json else None
    loop = asyncio.new_event_loop()
    env = dict(os.environ)
    session = Session(config, env, lambda: Journal(config.journal_path or default_journal_path(env)),
                      wire_progress=Progress())
    stopping.keep_loop(loop)
    worst = 0
    try:
        for number, args in commands:
            code = _one(args, out.json, session)
            if json_out is not None:
                json_out.emit({"type": "run", "line": number, "command": args[0], "exit_code": code})
            worst = max(worst, code)
            if code == ExitCode.INTERRUPTED:
                break  # Ctrl-C stops the whole run; the job it stopped resumes with the same line
    finally:
        stopping.keep_loop(None)
        loop.run_until_complete(session.close())
        loop.close()
    sys.exit(worst)
