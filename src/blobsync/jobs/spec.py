"""What each kind of job is asked to do (plain data: building one loads no job code), and what it asks back."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blobsync.backends.base import Location
from blobsync.errors import UsageError
from blobsync.filters import Filters
from blobsync.local.platform import usable_cores
from blobsync.options import CompareMode, DeleteMode, MaxDelete

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from blobsync.engine.prompt import Answer
    from blobsync.jobs.runner import RemoteRunner
    from blobsync.local.files import Source
    from blobsync.report import Action

    # Opens where a job's files run (upload: whether they write blobs), for the job's length (cluster/client.py).
    RemoteOpener = Callable[[bool, object], AbstractAsyncContextManager[RemoteRunner]]  # (upload, credential)

Cluster = Any  # what a caller may pass: None, a distributed.Client, 'tcp://host:8786', 'local:N' or 'processes:N'
PROCESSES = "processes:"  # the library's spelling of --processes N
MAX_PROCESSES = 256
AUTO_MIN_CORES = 4  # below this, `auto` keeps the one process: the service or the peers need the other cores


def parse_processes(text: str | int) -> int:
    """--processes: a number of worker processes, or 'auto' (one per usable core where there are at least
    AUTO_MIN_CORES, else 1: the plain engine in this process)."""
    if str(text).strip().lower() == "auto":
        cores = usable_cores()
        return cores if cores >= AUTO_MIN_CORES else 1
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PROCESSES:
        raise UsageError(f"invalid --processes {text!r}: 'auto' or a number of worker processes from 1 to "
                         f"{MAX_PROCESSES}")
    return n


@dataclass(frozen=True)
class Processes:
    """--processes N: the job's files in N worker processes of blobsync's own on this machine, no Dask. `started`:
    workers the command started before anything else (cluster.processes.prestart), for its first job to take."""

    count: int
    started: object | None = field(default=None, compare=False, repr=False)


DASK_SCHEMES = ("tcp://", "tls://", "ucx://", "inproc://", "ws://", "wss://")


def check_cluster_address(where: str) -> str:
    """A --cluster address as Dask takes it, checked before anything starts: 'local:N' (N from 1 to
    MAX_PROCESSES) or a scheduler's address; anything else is one line."""
    if where.startswith("local:"):
        n = where.removeprefix("local:")
        if not (n.isascii() and n.isdigit() and 1 <= int(n) <= MAX_PROCESSES):
            raise UsageError(f"invalid --cluster {where!r}: local:N takes a number of workers from 1 to "
                             f"{MAX_PROCESSES}, e.g. local:4")
        return where
    if where.startswith(("http://", "https://")):
        raise UsageError(f"invalid --cluster {where!r}: that is a web address (the dashboard's?); a Dask scheduler "
                         "listens at tcp://host:8786")
    scheme = where.split("://", 1)[0] + "://" if "://" in where else ""
    host = where.split("://", 1)[-1]
    if (scheme and scheme not in DASK_SCHEMES) or not re.fullmatch(r"[A-Za-z0-9.\-\[\]:_]+:[0-9]{1,5}", host):
        raise UsageError(f"invalid --cluster {where!r}: a Dask scheduler's address (tcp://host:8786) or local:N")
    return where


def processes_target(cluster: object) -> object:
    """A `cluster` argument as the job takes it, read once: 'processes:N' (or 'processes:auto') becomes Processes,
    or None where that means one process (the plain engine); a Dask address is checked; any other value is passed
    on as it is."""
    if isinstance(cluster, str) and not cluster.startswith(PROCESSES):
        return check_cluster_address(cluster)
    if not isinstance(cluster, str) or not cluster.startswith(PROCESSES):
        return cluster
    n = parse_processes(cluster.removeprefix(PROCESSES))
    return None if n == 1 else Processes(n)


@dataclass(frozen=True)
class UploadSpec:
    source: Path
    dest: Location
    filters: Filters = field(default_factory=Filters)  # which files of a folder take part
    dry_run: bool = False  # list what would be uploaded (on_action), send nothing, journal nothing


@dataclass(frozen=True)
class DownloadSpec:
    source: Location
    dest: Path
    dest_is_folder: bool = False  # the user wrote a trailing '/': a single blob keeps its own name inside
    filters: Filters = field(default_factory=Filters)  # which blobs under the prefix take part
    dry_run: bool = False  # list what would be downloaded (on_action), write nothing, journal nothing
    base: Path | None = None  # the folder the user named, when `dest` is one blobsync makes in it (cp -r's level)


@dataclass(frozen=True)
class CopySpec:
    """Blob to blob: `source` one blob (not `many`) or the prefix listed; `dest` the blob written, or the prefix
    the relative names go under."""

    source: Location
    dest: Location
    many: bool = False
    filters: Filters = field(default_factory=Filters)
    dry_run: bool = False


@dataclass(frozen=True)
class SyncSpec:
    local: Path | None  # None: blob to blob (`source` is the other side)
    remote: Location  # the container side; with `source`, the destination
    upload: bool  # True: the destination is `remote` (local -> remote, or blob to blob)
    filters: Filters = field(default_factory=Filters)
    compare: CompareMode = CompareMode.SIZE_AND_MTIME
    delete: DeleteMode = DeleteMode.FALSE
    max_delete: MaxDelete | None = None
    dry_run: bool = False
    # Uploads: a source file for which ready(rel, mtime_ns) is False is left alone this run, neither sent nor
    # deleted at the destination (watch mode holds files that are still being written).
    ready: Callable[[str, int], bool] | None = None
    batch_deletes: bool = True  # Blob Batch for the deletes
    source: Location | None = None  # blob to blob: the source container or prefix


@dataclass(frozen=True)
class RemoveSpec:
    target: Location
    recursive: bool = False
    filters: Filters = field(default_factory=Filters)
    dry_run: bool = False
    concurrency: int = 16  # deleters at most (each request also takes a slot of the adaptive limit), as sync's
    list_of_files: Path | None = None  # relative names, one per line, instead of listing the folder
    batch: bool = True  # Blob Batch for the deletes


@dataclass(frozen=True)
class PutSpec:
    """Data a library call holds (bytes, a file object) written as one blob; a file on disk, whose `resume_key`
    names it, resumes like a path."""

    source: Source
    dest: Location


JobSpec = UploadSpec | DownloadSpec | CopySpec | SyncSpec | RemoveSpec | PutSpec


@dataclass(frozen=True)
class Hooks:
    """What a job asks its caller while it runs: decisions to show, questions to answer, where to run."""

    on_action: Callable[[Action], None] | None = None  # each decision (a dry run's listing)
    confirm_overwrite: Callable[[str], Answer] | None = None  # --overwrite prompt, asked per file
    confirm_delete: Callable[[int], bool] | None = None  # --delete-destination prompt, asked once
    remote: RemoteOpener | None = None  # runs the transfers elsewhere (Dask workers, local worker processes)
