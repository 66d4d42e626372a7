"""Cutting a job's transfer list into shards on the client: about equal bytes and file counts, a few times as many
shards as workers so that fast workers take more, and files too big for one shard cut into block ranges."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from blobsync.backends.base import Capabilities
from blobsync.cluster.spec import RangeSpec, ShardSpec, WorkerJob
from blobsync.engine.blocks import block_count, choose_block_size
from blobsync.jobs.ops import FileOp, OpKind, upload_block_size

SHARDS_PER_WORKER = 3
MAX_FILES_PER_SHARD = 5000  # a shard's spec travels in one message: bounded, however many files the job has
MIN_SHARD_BYTES = 64 * 1024 * 1024  # below this a shard costs more in scheduling than it saves in balance


@dataclass(frozen=True)
class SplitFile:
    """A file cut into block ranges: one task each, one hash task, one commit (or finish) task after them all."""

    ranges: tuple[RangeSpec, ...]

    @property
    def file(self) -> FileOp:
        return self.ranges[0].file

    @property
    def whole(self) -> RangeSpec:
        """The whole file as one range: what its hash and its commit (or finish) task take."""
        first = self.ranges[0]
        return RangeSpec(first.job, first.file, first.block_size, 0, self.ranges[-1].last)


@dataclass(frozen=True)
class Sizing:
    shard_bytes: int
    shard_files: int
    workers: int


def sizing(files: int, nbytes: int, workers: int) -> Sizing:
    shards = max(1, workers * SHARDS_PER_WORKER)
    return Sizing(max(MIN_SHARD_BYTES, -(-nbytes // shards)),
                  max(1, min(MAX_FILES_PER_SHARD, -(-files // shards))), max(1, workers))


def cut(files: Iterable[FileOp], job: WorkerJob, size: Sizing, *, block_size_of: Callable[[FileOp], int],
        split: bool) -> Iterator[ShardSpec | SplitFile]:
    """Shards as the files stream by (nothing is held but the shard being filled)."""
    shard: list[FileOp] = []
    nbytes = 0
    number = 0
    for f in files:
        block_size = block_size_of(f)
        if split and f.size > size.shard_bytes and block_count(f.size, block_size) > 1:
            yield _split(job, f, block_size, min(size.shard_bytes, -(-f.size // (2 * size.workers))))
            continue
        shard.append(f)
        nbytes += f.size
        if len(shard) >= size.shard_files or nbytes >= size.shard_bytes:
            yield ShardSpec(job, number, tuple(shard))
            number += 1
            shard, nbytes = [], 0
    if shard:
        yield ShardSpec(job, number, tuple(shard))


def _split(job: WorkerJob, f: FileOp, block_size: int, range_bytes: int) -> SplitFile:
    """Ranges of whole blocks, at least two per worker: every worker takes part in one huge file."""
    n = block_count(f.size, block_size)
    per = max(1, range_bytes // block_size)
    return SplitFile(tuple(RangeSpec(job, _windowed(f, first, min(n, first + per)), block_size, first,
                                     min(n, first + per)) for first in range(0, n, per)))


_HOLE = ("", 0, b"")  # a block of the commit record outside a range task's window: one object, pickled once


def _windowed(f: FileOp, first: int, last: int) -> FileOp:
    """The operation as a range task gets it: the commit record's blocks of its window only (a 50,000-block record
    is ~4 MB; shipped whole to every range task it would cost that much per task)."""
    if f.delta is None:
        return f
    blocks = tuple(b if first <= i < last else _HOLE for i, b in enumerate(f.delta.blocks))
    return replace(f, delta=replace(f.delta, blocks=blocks))


class BlockSizer:
    """The block size a file gets: its committed version's for a delta, else the engine's rule for the size asked
    for (jobs.ops.upload_block_size, as the plain job)."""

    def __init__(self, requested: int, store: Capabilities) -> None:
        self.requested = requested
        self.store = store

    def __call__(self, f: FileOp) -> int:
        return upload_block_size(f, self.requested, self.store) if f.kind is OpKind.UPLOAD else \
            choose_block_size(f.size, self.requested, self.store)
