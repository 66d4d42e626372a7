"""One transfer through the library paths the safety matrix covers, as its own process (so a test can hold its
requests and swap files under it as it does with the CLI): `python pathrun.py client|fsspec cp|sync SRC DST
[--delete] --journal J`. It prints each failed file's reason on stderr and exits with the report's exit code."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import blobsync
from blobsync.errors import BlobsyncError


def _client(args: argparse.Namespace, config: blobsync.TransferConfig) -> int:
    with blobsync.Client(os.environ["PATHRUN_CONTAINER_URL"], config) as c:
        if args.command == "sync":
            report = c.sync(args.src, args.dst, delete="true" if args.delete else "false")
        else:
            report = c.copy(args.src, args.dst)
    for failure in report.failures:
        print(f"{failure.rel}: {failure.reason}", file=sys.stderr)
    return int(report.exit_code)


def _fsspec(args: argparse.Namespace, config: blobsync.TransferConfig) -> int:
    from blobsync.fsspec import BlobsyncFileSystem

    account = os.environ["PATHRUN_ACCOUNT_URL"]
    sas = os.environ["PATHRUN_CONTAINER_URL"].partition("?")[2]  # fsspec takes a SAS as the credential
    fs = BlobsyncFileSystem(account, credential=sas or None, config=config, skip_instance_cache=True)

    def path(url: str) -> str:  # 'container/path' under the account
        return url.split("?", 1)[0].removeprefix(account).strip("/").removesuffix("/*")

    try:
        if "://" in args.src:
            fs.get(path(args.src), args.dst, recursive=True)
        else:
            fs.put(args.src, path(args.dst), recursive=True)
    except (BlobsyncError, OSError) as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    finally:
        fs.client.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", choices=["client", "fsspec"])
    parser.add_argument("command", choices=["cp", "sync"])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--delete", action="store_true")
    parser.add_argument("--journal", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # a library's warnings, as a script sees them
    # fsspec walks folders itself and copies blob by blob: recursive is the Client's own cp -r.
    config = blobsync.TransferConfig(journal_path=args.journal, recursive=args.path == "client", max_retries=1)
    try:
        return _client(args, config) if args.path == "client" else _fsspec(args, config)
    except BlobsyncError as exc:
        print(f"blobsync: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)


if __name__ == "__main__":
    sys.exit(main())
