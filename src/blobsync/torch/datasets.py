"""Datasets of blobs for DataLoader workers: BlobDataset (map-style: one listing, item i is blob i's bytes) and
IterableBlobDataset (split by DataLoader worker and by DDP rank, every item once per epoch, read ahead under a
memory budget). Each worker process opens its own session: the Client pickles for spawn and starts anew after
a fork."""

from __future__ import annotations

import collections
import concurrent.futures
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from blobsync.backends.base import BlobProperties
from blobsync.client import Client
from blobsync.config import TransferConfig
from blobsync.errors import UsageError
from blobsync.redact import strip_query
from blobsync.torch._paths import below, container_path, folder_url

Transform = Callable[[bytes], Any]
MAX_AHEAD = 256  # blobs read ahead at most, however small (the Client's request limit bounds the requests)


class _Listing:
    """The blobs under a folder URL, listed once (names relative to the folder, sorted), and the Client reading them."""

    def __init__(self, url: str, client: Client | None, config: TransferConfig | None, credential: object) -> None:
        self.url = folder_url(url, "url_prefix")
        self.client = client if client is not None else Client(self.url, config, credential=credential)
        self.prefix = below(self.client, self.url)
        props = self.client.ls(self.prefix)
        if not props:
            raise UsageError(f"no blobs under {strip_query(self.url)}: nothing to load")
        start = len(container_path(self.url))
        self.blobs: list[BlobProperties] = sorted(props, key=lambda p: p.name)
        self.names = [p.name[start:] for p in self.blobs]  # relative to the folder

    def read(self, index: int) -> bytes:
        return self.client.get(self.prefix + self.names[index])


class BlobDataset(Dataset[Any]):
    """Map-style: `dataset[i]` is the bytes of the i-th blob under `url_prefix` (sorted by name), or
    `transform(bytes)`. `names[i]` is its name relative to the folder. Works with any Sampler (DistributedSampler
    too) and with DataLoader workers under fork or spawn."""

    def __init__(self, url_prefix: str, transform: Transform | None = None, *, client: Client | None = None,
                 config: TransferConfig | None = None, credential: object = None) -> None:
        self._listing = _Listing(url_prefix, client, config, credential)
        self.names = self._listing.names
        self.transform = transform

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> Any:
        if not -len(self.names) <= index < len(self.names):
            raise IndexError(f"index {index} out of range for {len(self.names)} blobs")
        data = self._listing.read(index % len(self.names))
        return self.transform(data) if self.transform is not None else data


class IterableBlobDataset(IterableDataset[Any]):
    """Iterable: each epoch yields every blob under `url_prefix` once across all ranks and DataLoader workers (blob
    i goes to the (rank, worker) i falls to, in order, or shuffled per epoch with `shuffle` and `set_epoch`). Blobs
    are read ahead while the caller works, at most `read_ahead_bytes` (default: the Client's memory budget) in
    flight. `rank`/`world_size` default to the process group's when it is made (else one rank): make it after
    init_process_group, or pass them."""

    def __init__(self, url_prefix: str, transform: Transform | None = None, *, shuffle: bool = False, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, read_ahead_bytes: int | None = None,
                 client: Client | None = None, config: TransferConfig | None = None,
                 credential: object = None) -> None:
        for value, what in ((seed, "seed"), (rank, "rank"), (world_size, "world_size"),
                            (read_ahead_bytes, "read_ahead_bytes")):  # checked before any request
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"invalid {what}={value!r}: a whole number")
        self._listing = _Listing(url_prefix, client, config, credential)
        self.names = self._listing.names
        self.transform, self.shuffle, self.seed, self.epoch = transform, shuffle, seed, 0
        # Read here, in the process that made it: a spawned DataLoader worker has no process group of its own.
        self.rank: int | None = rank
        self.world_size: int | None = world_size
        if _grouped():
            self.rank, self.world_size = _rank(rank, world_size)
        self.read_ahead = read_ahead_bytes or self._listing.client.aio.config.memory

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration is (a new order with `shuffle`), as DistributedSampler.set_epoch."""
        self.epoch = epoch

    def mine(self) -> list[int]:
        """The indexes of the blobs this rank's this worker yields, in order."""
        order = list(range(len(self.names)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        rank, world = _rank(self.rank, self.world_size)
        worker = get_worker_info()
        wid, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        return order[rank * workers + wid::world * workers]

    def __iter__(self) -> Iterator[Any]:
        listing, sizes = self._listing, [p.size for p in self._listing.blobs]
        client = listing.client
        pending: collections.deque[tuple[int, concurrent.futures.Future[bytes]]] = collections.deque()
        order, taken, in_flight = self.mine(), 0, 0
        try:
            while True:
                # Read ahead while the budget lasts (one blob at least, however large).
                while taken < len(order) and len(pending) < MAX_AHEAD and (
                        not pending or in_flight + sizes[order[taken]] <= self.read_ahead):
                    index, taken = order[taken], taken + 1
                    pending.append((index, client.submit(client.aio.get, listing.prefix + listing.names[index])))
                    in_flight += sizes[index]
                if not pending:
                    return
                index, future = pending.popleft()
                data = future.result()
                in_flight -= sizes[index]
                yield self.transform(data) if self.transform is not None else data
        finally:
            for _, future in pending:
                future.cancel()


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank(rank: int | None, world: int | None) -> tuple[int, int]:
    if rank is None or world is None:
        rank = rank if rank is not None else dist.get_rank() if _grouped() else 0
        world = world if world is not None else dist.get_world_size() if _grouped() else 1
    if not 0 <= rank < world:
        raise UsageError(f"invalid rank={rank} for world_size={world}")
    return rank, world
