"""`blobsync bench URL`: how fast this machine moves data to and from a container, and what bounds it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import click

from blobsync import stopping
from blobsync.backends.registry import parse_location
from blobsync.cli.common import handle_errors, output_options, setup_logging
from blobsync.cli.config_flags import config_from, config_options
from blobsync.cli.output import JsonLines, human_bytes
from blobsync.engine.session import Session
from blobsync.errors import ExitCode, UsageError
from blobsync.journal import Journal, default_journal_path
from blobsync.redact import strip_query

_FLAGS = ("block_size", "put_blob_size", "concurrency", "memory", "cap_mbps", "put_md5", "block_check", "check_md5",
          "journal_path", "proxy", "max_retries", "trusted_suffixes")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """AzCopy's --size-per-file: a number and K, M, G or T (binary units: 250M is 250 MiB)."""
    match = _SIZE.match(text)
    if match is None:
        raise UsageError(f"invalid --size-per-file {text!r}: a number and K, M, G or T, e.g. 250M")
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if not 0 <= size <= 4 << 40:
        raise UsageError(f"invalid --size-per-file {text!r}: 0 to 4T")
    return size


@click.command("bench")
@handle_errors
@click.argument("url")
@click.option("--size-per-file", default="250M", show_default=True, help="Size of each generated file (K, M, G).")
@click.option("--file-count", type=click.IntRange(1, 1_000_000), default=100, show_default=True,
              help="How many files.")
@click.option("--mode", type=click.Choice(["upload", "download", "both"], case_sensitive=False), default="both",
              show_default=True, help="upload only, or upload then download (download and both measure both).")
@click.option("--delete-test-data/--no-delete-test-data", default=True, show_default=True,
              help="Delete the test folder (and its local copy) afterwards.")
@click.option("--scratch", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where downloads land (a temporary folder in it, removed after) [default: the system's].")
@config_options(_FLAGS)
@output_options
def bench(url: str, size_per_file: str, file_count: int, mode: str, delete_test_data: bool, scratch: Path | None,
          out: Any, log_level: str, log_file: Path | None, **options: Any) -> None:
    """Measure uploads and downloads between this machine and URL (a container, or a folder in it).

    Generated files go up to a new folder under URL (blobsync-bench-<time>-<id>/), come down to a temporary folder,
    and both are deleted. Prints MB/s, files/s, this machine's CPU, where --concurrency auto settled, what bounded
    each phase (the link or the service, throttling, the CPU, the cap) and the flags that would help.
    """
    setup_logging(log_level, log_file)
    from blobsync.jobs.bench import BenchSpec, run_bench

    config = config_from(options)
    loc = parse_location(url)
    if not loc.container:
        raise UsageError(f"{strip_query(url)!r} names no container: bench writes a folder of its own into one")
    spec = BenchSpec(loc, parse_size(size_per_file), file_count, mode.lower() != "upload", delete_test_data, scratch)
    env = dict(os.environ)
    stopping.stop_on_signals()

    async def go() -> Any:
        session = Session(config, env, lambda: Journal(config.journal_path or default_journal_path(env)))
        try:
            return await run_bench(spec, session, config)
        finally:
            await session.close()

    try:
        result = stopping.run(go())
    except KeyboardInterrupt:
        click.echo("blobsync: interrupted; the test folder may be left: delete it with blobsync rm -r", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    _show(result, spec, out)
    failed = sum(p.failed for p in result.phases)
    sys.exit(int(ExitCode.PARTIAL) if failed else 0)


def _show(result: Any, spec: Any, out: Any) -> None:
    if out.json:
        JsonLines().emit({"type": "bench", "folder": result.folder, "size_per_file": spec.size,
                          "file_count": spec.count, "deleted": result.deleted, "phases": [
                              {"phase": p.name, "files": p.files, "bytes": p.bytes, "seconds": round(p.seconds, 3),
                               "mb_per_s": round(p.mb_per_s, 2), "files_per_s": round(p.files_per_s, 1),
                               "cpu_seconds": round(p.cpu_seconds, 2), "concurrency": p.concurrency,
                               "concurrency_auto": p.concurrency_auto, "retries": p.retries,
                               "throttled": p.throttled, "failed": p.failed, "bound": p.bound,
                               "suggestions": p.suggestions} for p in result.phases]})
        return
    if out.silent:
        return
    click.echo(f"bench: {spec.count} x {human_bytes(spec.size)} in {result.folder}")
    for p in result.phases:
        level = f"auto, settled at {p.concurrency}" if p.concurrency_auto else f"{p.concurrency}"
        click.echo(f"  {p.name:<8} {p.mb_per_s:9.1f} MB/s {p.files_per_s:8.1f} files/s  {p.seconds:.2f} s, "
                   f"client CPU {p.cpu_seconds:.2f} s, concurrency {level}, {p.retries} retries"
                   + (f", {p.failed} failed" if p.failed else ""))
        click.echo(f"           bounded by {p.bound}")
        for tip in p.suggestions:
            click.echo(f"           try: {tip}")
    if spec.delete:
        click.echo(f"  deleted {result.deleted} test blob(s)")
