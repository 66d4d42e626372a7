"""What a worker is given and gives back: plain, picklable records (no Dask types), so any scheduler can run them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from blobsync.jobs.ops import FileOp
from blobsync.journal import CommittedBlob


@dataclass(frozen=True)
class WorkerJob:
    """What every task of one job shares: where the bytes go, and the options the worker runs with."""

    job: str  # the client's job id
    upload: bool
    local_root: str  # the same path on every worker (a shared file system)
    url: str = field(repr=False)  # the container URL as the user gave it, SAS included (never journaled)
    options: dict[str, Any]  # TransferConfig.worker_options(), the cap already split across the workers
    proxy: str | None = None
    topic: str = ""  # where workers publish progress
    # blob-to-blob copies: the source container's URL as given, SAS included (never journaled)
    source_url: str = field(default="", repr=False)
    # the caller's Client's credential for `url`'s account (None: its SAS or the environment's)
    credential: object = field(default=None, repr=False)
    base: str = ""  # the folder the user named (`local_root` may be one blobsync made in it): no link below is followed


@dataclass(frozen=True)
class ShardSpec:
    job: WorkerJob
    shard: int
    files: tuple[FileOp, ...]  # each with its nonce, fixed by the client: a rerun stages the same parts


@dataclass(frozen=True)
class RangeSpec:
    """Blocks [first, last) of one huge file, staged (upload) or fetched into the shared partial file (download)."""

    job: WorkerJob
    file: FileOp
    block_size: int
    first: int
    last: int
    done: tuple[int, ...] = ()  # blocks of the window in the partial file already (a resumed split download)


@dataclass
class FileOutcome:
    rel: str
    ok: bool
    sent: int = 0
    reason: str = ""
    exit_code: int = 0
    skipped: bool = False
    digest: str = ""  # a download's whole MD5 (hex) where it differed from the blob's: the client fetches again
    delta: int = 0  # an upload's bytes of unchanged blocks kept from the committed version, not sent
    etag: str = ""  # transferred: the version written (upload, copy) or read (download)
    md5: str = ""  # transferred: the bytes' MD5 (hex), as the blob's Content-MD5 holds it
    commit: CommittedBlob | None = None  # an upload in blocks: the record the next delta builds on
    copied: int = 0  # an incremental upload's bytes of unchanged blocks the service staged from an earlier blob


@dataclass
class ShardReport:
    """What one task did, for the client's report and journal."""

    label: str  # 'shard 3', or 'big.bin blocks 0-15'
    worker: str
    files: int = 0
    bytes: int = 0
    sent: int = 0
    duration: float = 0.0
    retries: int = 0
    outcomes: list[FileOutcome] = field(default_factory=list)
    # a split upload's range, per block: (index, part token, kept from the committed version, xxh3-128 hex, CRC64
    # hex or "")
    blocks: list[tuple[int, str, bool, str, str]] = field(default_factory=list)


def file_nonce(job: str, rel: str, size: int, mtime_ns: int) -> str:
    """A nonce for one version of one file in one job: the same on every machine and every rerun of the job, and
    another one as soon as the file changes."""
    return hashlib.sha256(f"{job}\0{rel}\0{size}\0{mtime_ns}".encode()).hexdigest()[:16]
