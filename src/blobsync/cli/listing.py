"""`blobsync ls` and `blobsync rm`: list the blobs a URL names, and remove them (AzCopy's list and remove)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import click

from blobsync import api
from blobsync.backends.base import BlobProperties
from blobsync.cli.common import (
    handle_errors,
    logging_options,
    output_options,
    proxy_option,
    run_job,
    setup_logging,
    start_output,
)
from blobsync.cli.output import JsonLines, human_bytes
from blobsync.config import TransferConfig
from blobsync.engine.context import Progress
from blobsync.redact import printable
from blobsync.report import Report
from blobsync.syncing.filters import Filters
from blobsync.syncing.job import Action


def _record(props: BlobProperties) -> dict[str, object]:
    return {
        "type": "blob", "name": props.name, "size": props.size, "tier": props.tier,
        "content_md5": base64.b64encode(props.content_md5).decode() if props.content_md5 else None,
        "last_modified": props.last_modified.strftime("%Y-%m-%dT%H:%M:%SZ"), "content_type": props.content_type,
        "etag": props.etag,
    }


def _line(props: BlobProperties) -> str:
    md5 = props.content_md5.hex() if props.content_md5 else "-" * 32
    return (f"{props.last_modified:%Y-%m-%d %H:%M:%S}  {props.size:>14}  {props.tier or '-':<7}  {md5}  "
            f"{props.name}")


@click.command()
@click.argument("url")
@click.option("--output-type", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
              show_default=True, help="json: one JSON object per blob, then a summary object.")
@click.option("--max-retries", type=int, default=8, show_default=True, help="Retries per listing request.")
@proxy_option
@logging_options
@handle_errors
def ls(url: str, output_type: str, max_retries: int, proxy: str | None, log_level: str,
       log_file: Path | None) -> None:
    """List the blob URL names, or every blob under a container or folder URL.

    One line per blob: last modified (UTC), size in bytes, access tier, Content-MD5 (hex) and name, then a
    total. Listing needs the 'l' (list) permission in a SAS.
    """
    setup_logging(log_level, log_file)
    json_out = JsonLines() if output_type.lower() == "json" else None

    async def show() -> tuple[int, int]:
        count = total = 0
        async for props in api.list_blobs_async(url, max_retries=max_retries, proxy=proxy):
            count += 1
            total += props.size
            if json_out is not None:
                json_out.emit(_record(props))
            else:
                click.echo(_line(props))
        return count, total

    count, total = asyncio.run(show())
    if json_out is not None:
        json_out.emit({"type": "summary", "blobs": count, "bytes": total})
    else:
        click.echo(f"{count} blob(s), {human_bytes(total)} ({total} bytes)")


@click.command()
@click.argument("url")
@click.option("-r", "--recursive", is_flag=True, help="Remove every blob under the container or folder URL.")
@click.option("--include-pattern", default=None, help="Only blob names matching these globs, 'a*.pt;*.h5'.")
@click.option("--exclude-pattern", default=None, help="Keep blob names matching these globs.")
@click.option("--include-path", default=None, help="Only these relative paths or folders, 'a/b;c'.")
@click.option("--exclude-path", default=None, help="Keep these relative paths or folders.")
@click.option("--include-regex", default=None, help="Only relative paths matching these regexes.")
@click.option("--exclude-regex", default=None, help="Keep relative paths matching these regexes.")
@click.option("--include-after", default=None, help="Only blobs modified at or after this ISO 8601 time.")
@click.option("--include-before", default=None, help="Only blobs modified before this ISO 8601 time.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@click.option("--list-of-files", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Remove the blobs this file names, one path (relative to the URL) per line.")
@click.option("--concurrency", type=int, default=16, show_default=True, help="Deletes in flight.")
@click.option("--max-retries", type=int, default=8, show_default=True, help="Retries per request.")
@proxy_option
@output_options
@handle_errors
def rm(url: str, recursive: bool, include_pattern: str | None, exclude_pattern: str | None,
       include_path: str | None, exclude_path: str | None, include_regex: str | None, exclude_regex: str | None,
       include_after: str | None, include_before: str | None, dry_run: bool, list_of_files: Path | None,
       concurrency: int, max_retries: int, proxy: str | None,
       output_type: str, progress_interval: float | None, quiet: bool, log_level: str,
       log_file: Path | None) -> None:
    """Remove the blob URL names or, with -r, the blobs under a container or folder URL.

    Filters (relative to the URL) choose which; snapshots go with their blob. Needs 'd' (delete) in a SAS,
    and 'l' (list) with -r.
    """
    setup_logging(log_level, log_file)
    filters = Filters.parse(
        include_pattern=include_pattern, exclude_pattern=exclude_pattern, include_path=include_path,
        exclude_path=exclude_path, include_regex=include_regex, exclude_regex=exclude_regex,
        include_after=include_after, include_before=include_before,
    )
    if not recursive and not list_of_files and filters != Filters():
        raise click.UsageError("filters choose among many blobs: use them with -r or --list-of-files")
    config = TransferConfig(concurrency=concurrency, max_retries=max_retries, proxy=proxy)
    json_out = start_output("rm", output_type, url=url, recursive=recursive, dry_run=dry_run)

    def on_action(action: Action) -> None:
        if dry_run and json_out is None:
            click.echo(f"would remove {printable(action.path)} ({human_bytes(action.size)})")

    def call(progress: Progress) -> Report:
        return api.remove(url, config, recursive=recursive, filters=filters, dry_run=dry_run,
                          list_of_files=list_of_files, progress=progress, on_action=on_action)

    run_job(call, quiet=quiet or dry_run, json_out=json_out, interval=progress_interval, dry_run=dry_run)
