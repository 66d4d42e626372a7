"""`blobsync ls` and `blobsync rm`: list the blobs a URL names, and remove them (AzCopy's list and remove)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import click

from blobsync import api, calls
from blobsync.backends.base import BlobProperties
from blobsync.cli.azcopy import AzCommand, azcopy_flags
from blobsync.cli.common import (
    OutputMode,
    exit_codes_option,
    filter_options,
    handle_errors,
    logging_options,
    output_options,
    run_command,
    run_session,
    setup_logging,
    start_output,
)
from blobsync.cli.config_flags import config_option
from blobsync.cli.output import JsonLines, human_bytes
from blobsync.config import Concurrency, TransferConfig, parse_suffixes
from blobsync.events import Progress
from blobsync.filters import Filters
from blobsync.redact import printable
from blobsync.report import Action, Report


def _record(rel: str, props: BlobProperties) -> dict[str, object]:
    return {
        "type": "blob", "name": props.name, "path": rel, "size": props.size, "tier": props.tier,
        "content_md5": base64.b64encode(props.content_md5).decode() if props.content_md5 else None,
        "last_modified": props.last_modified.strftime("%Y-%m-%dT%H:%M:%SZ"), "content_type": props.content_type,
        "etag": props.etag,
    }


def _line(rel: str, props: BlobProperties) -> str:
    md5 = props.content_md5.hex() if props.content_md5 else "-" * 32
    return (f"{props.last_modified:%Y-%m-%d %H:%M:%S}  {props.size:>14}  {props.tier or '-':<7}  {md5}  "
            f"{printable(rel)}")


@click.command(cls=AzCommand)
@handle_errors  # outermost: the option wrappers below raise usage errors too
@click.argument("url")
@click.option("--output-type", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
              show_default=True, help="json: one JSON object per blob (name and path), then a summary object.")
@click.option("--output-level", type=click.Choice(["default", "essential", "quiet"], case_sensitive=False),
              default="default", help="quiet: no total line.")
@config_option("max_retries")
@config_option("proxy")
@config_option("trusted_suffixes")
@azcopy_flags("list")
@logging_options
@exit_codes_option
def ls(url: str, output_type: str, output_level: str, max_retries: int, proxy: str | None,
       trusted_suffixes: str | None, log_level: str, log_file: Path | None) -> None:
    """List the blob URL names, or every blob under a container or folder URL.

    One line per blob: last modified (UTC), size in bytes, access tier, Content-MD5 (hex) and the name relative
    to the URL (as AzCopy prints it), then a total. Listing needs the 'l' (list) permission in a SAS.
    """
    setup_logging(log_level, log_file)
    json_out = JsonLines() if output_type.lower() == "json" else None

    async def show() -> tuple[int, int]:
        count = total = 0
        async for rel, props in api.blob_entries_async(url, max_retries=max_retries, proxy=proxy,
                                                       trusted_suffixes=parse_suffixes(trusted_suffixes)):
            count += 1
            total += props.size
            if json_out is not None:
                json_out.emit(_record(rel, props))
            else:
                click.echo(_line(rel, props))
        return count, total

    count, total = asyncio.run(show())
    if json_out is not None:
        json_out.emit({"type": "summary", "blobs": count, "bytes": total})
    elif output_level.lower() != "quiet":
        click.echo(f"{count} blob(s), {human_bytes(total)} ({total} bytes)")


@click.command(cls=AzCommand)
@handle_errors  # outermost: the option wrappers below raise usage errors too
@click.argument("url")
@click.option("-r", "--recursive", is_flag=True, help="Remove every blob under the container or folder URL.")
@filter_options
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@click.option("--list-of-files", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Remove the blobs this file names, one path (relative to the URL) per line.")
@config_option("concurrency")
@config_option("max_retries")
@config_option("proxy")
@config_option("trusted_suffixes")
@azcopy_flags("remove")
@output_options
def rm(url: str, recursive: bool, filters: Filters, dry_run: bool, list_of_files: Path | None,
       concurrency: Concurrency, max_retries: int, proxy: str | None, trusted_suffixes: str | None, out: OutputMode,
       log_level: str, log_file: Path | None) -> None:
    """Remove the blob URL names or, with -r, the blobs under a container or folder URL.

    Filters (relative to the URL) choose which; snapshots go with their blob. Needs 'd' (delete) in a SAS,
    and 'l' (list) with -r.
    """
    setup_logging(log_level, log_file)
    if not recursive and not list_of_files and filters != Filters():
        raise click.UsageError("filters choose among many blobs: use them with -r or --list-of-files")
    config = TransferConfig(concurrency=concurrency, max_retries=max_retries, proxy=proxy,
                            trusted_suffixes=parse_suffixes(trusted_suffixes))
    json_out = start_output("rm", out, url=url, recursive=recursive, dry_run=dry_run)

    def on_action(action: Action) -> None:
        if dry_run and json_out is None and not out.silent:
            click.echo(f"would remove {printable(action.path)} ({human_bytes(action.size)})")

    def call(progress: Progress) -> Report:
        remove = api.on_session(calls.remove_on, run_session())
        return remove(url, config, recursive=recursive, filters=filters, dry_run=dry_run,
                      list_of_files=list_of_files, progress=progress, on_action=on_action)

    run_command(call, out, json_out=json_out, dry_run=dry_run, quiet=dry_run)
