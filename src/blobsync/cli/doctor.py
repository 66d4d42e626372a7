"""`blobsync doctor URL`: what the URL's credentials allow, and whether the endpoint and container answer."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from blobsync.cli.common import Finite, handle_errors, logging_options, setup_logging
from blobsync.cli.config_flags import config_option
from blobsync.cli.output import JsonLines
from blobsync.config import parse_suffixes


@click.command()
@click.argument("url")
@click.option("--write-test", is_flag=True, help="Also put, read back and delete a small probe blob.")
@click.option("--timeout", type=Finite(0.1, 3600, " seconds"), default=15, show_default=True,
              help="Seconds to wait for the endpoint.")
@click.option("--output-type", type=click.Choice(["text", "json"], case_sensitive=False), default="text",
              show_default=True, help="json: one object with every finding.")
@config_option("proxy")
@config_option("trusted_suffixes")
@logging_options
@handle_errors
def doctor(url: str, write_test: bool, timeout: float, output_type: str, proxy: str | None,
           trusted_suffixes: str | None, log_level: str, log_file: Path | None) -> None:
    """Check a container URL before a transfer: its SAS (permissions, expiry, start, protocol, resource,
    IP range) or other credential, what an upload, download, sync or rm would still need, and whether the
    endpoint answers and the container exists. Secrets are never printed.

    Exit code 0 when nothing failed, 3 for a credential or permission problem, 1 otherwise.
    """
    from blobsync.api import diagnose
    from blobsync.backends.diagnosis import Level  # here: every other command starts without it

    setup_logging(log_level, log_file)
    d = diagnose(url, write_test=write_test, timeout=timeout, proxy=proxy,
                 trusted_suffixes=parse_suffixes(trusted_suffixes))
    if output_type.lower() == "json":
        JsonLines().emit({
            "type": "doctor", "url": d.url, "credential": d.credential,
            "findings": [{"level": f.level.value.lower(), "topic": f.topic, "text": f.text} for f in d.findings],
            "missing": d.missing, "exit_code": int(d.exit_code),
        })
        sys.exit(int(d.exit_code))
    click.echo(f"{d.url}")
    click.echo(f"  credential: {d.credential}")
    for f in d.findings:
        click.echo(f"  {f.level.value:<4}  {f.topic + ':':<16} {f.text}")
    if d.missing:
        click.echo("  what the SAS still lacks, per operation:")
        for operation, lacking in d.missing.items():
            click.echo(f"    {operation:<30} needs {lacking}")
    elif any(f.topic == "permissions" and f.level is Level.OK for f in d.findings):
        click.echo("  the SAS permissions allow every blobsync operation")
    sys.exit(int(d.exit_code))
