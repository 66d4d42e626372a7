"""PyTorch Distributed Checkpoint (DCP) on Blob: BlobStorageWriter and BlobStorageReader, so that
`dcp.save(state, storage_writer=BlobStorageWriter(url))` and `dcp.load` work unchanged.

A checkpoint is in DCP's own format, as its FileSystemWriter writes it: `__<rank>_<n>.distcp` blobs holding each
tensor as `torch.save` of it and each bytes item as it is, and `.metadata` (DCP's Metadata, `_StorageInfo`
records): downloaded, it loads with DCP's FileSystemReader and `dcp_to_torch_save`, and a folder FileSystemWriter
wrote, uploaded, loads here. Each rank's items are spread over blobs written at once, each staged from tensor
memory in blocks under the Client's budgets, committed once with its whole MD5 and CRC64, and verified; the
coordinator writes `.metadata` last, after checking that every rank's blob is there with the bytes its results
name. A checkpoint without `.metadata` is incomplete, and the reader refuses it with one line. Loads plan their
reads per blob (see _dcp_read)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from blobsync.backends.registry import is_remote
from blobsync.blobfile import BlobWriter
from blobsync.client import Client
from blobsync.config import Overwrite, TransferConfig
from blobsync.errors import BlobNotFoundError, ConflictError, IntegrityError, UsageError
from blobsync.redact import strip_query
from blobsync.report import FileResult
from blobsync.torch._dcp_read import Loader, Need
from blobsync.torch._dcp_write import write_rank
from blobsync.torch._paths import base_path, below, folder_url
from blobsync.torch._unpickle import load_metadata

__all__ = ["BlobStorageReader", "BlobStorageWriter", "IncompleteCheckpointError"]
METADATA = ".metadata"
_RANK_METADATA = re.compile(r"__\d+\.metadata")  # a rank's own, from a save without collectives


class IncompleteCheckpointError(BlobNotFoundError):
    """A checkpoint folder without its `.metadata`: a save that never finished (or no checkpoint at all)."""


@dataclass(frozen=True)
class BlobStorageInfo:
    """Where one item's bytes are in a checkpoint blobsync wrote before it wrote DCP's own format (read, never
    written): the raw bytes of a contiguous tensor of `dtype` and `shape` (None: a BYTE_IO item's bytes)."""

    relative_path: str
    offset: int
    length: int
    dtype: str | None = None
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Prefix:  # the storage_data of plans blobsync wrote before DCP's own _StoragePrefix: kept for unpickling
    prefix: str


class _Folder:
    """One checkpoint folder on Blob, through a Client whose URL is the folder (names are relative to it): a given
    Client, or one of its own, made again on use after `close()` (a writer or reader used for another save)."""

    def __init__(self, url: str | os.PathLike[str], client: Client | None, config: TransferConfig | None,
                 credential: object) -> None:
        self.url = folder_url(url)
        self._given, self._config, self._credential = client, config, credential
        self._own: Client | None = None
        if client is None:
            self._own = Client(self.url, config, credential=credential)  # made now: a bad URL is said here

    @property
    def client(self) -> Client:
        if self._given is not None:
            return self._given
        if self._own is None:
            self._own = Client(self.url, self._config, credential=self._credential)
        return self._own

    def close(self) -> None:
        """Close the Client this folder made (a given one is its owner's to close)."""
        own, self._own = self._own, None
        if own is not None:
            own.close()

    def __getstate__(self) -> dict[str, Any]:  # to a process-based async save: it opens a session of its own
        return {**self.__dict__, "_own": None}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        if checkpoint_id is not None and folder_url(checkpoint_id) != self.url:
            self.close()
            self.url = folder_url(checkpoint_id)

    def name(self, relative: str) -> str:
        """`relative` under the folder, as the Client names it (a Client of the folder itself, or a given one)."""
        return below(self.client, self.url) + relative

    @property
    def display(self) -> str:
        return strip_query(self.url)


class BlobStorageWriter(StorageWriter):
    """DCP's storage for a save to a folder URL on Blob (a SAS in it, or `credential`, or the environment's).
    `client` shares an existing Client's session (budgets, connections); `config` sets block size, memory and
    concurrency of one made here. `overwrite=False` refuses a folder that holds a complete checkpoint already.
    `thread_count`: the blobs each rank's items are spread over, written at once (None: one per 128 MiB of the
    rank's state, up to one per core), as FileSystemWriter's. `incremental=True` keeps each blob's block digests
    beside it (`<blob>.blocks`), and with `base` (the folder URL of an earlier checkpoint in the same container)
    has the service stage every block equal to the same block of its namesake there, sending only the others:
    each checkpoint stays whole (deleting `base` later breaks nothing). `put_md5=True` also commits each blob with
    its whole Content-MD5 (one serial pass a blob), for tools that check one on download; without it (as DCP's
    FileSystemWriter stores no checksum) each blob's whole check is the CRC64 composed from its blocks' (which the
    service checks one by one), stored with it and checked by blobsync's whole reads. It is this argument, not
    `config`'s put_md5, as `overwrite` is. `zip_crc32=True` has each tensor item's zip records carry their CRC32,
    as torch.save's defaults write them, for tools that unzip an item; by default they carry 0, as
    `torch.serialization.set_crc32_options(False)` saves: torch.load (and so every DCP reader) never checks it, and
    it costs a serial pass over the bytes. `written` holds what this rank's blobs of the last save sent and had
    staged."""

    def __init__(self, url: str | os.PathLike[str], *, client: Client | None = None,
                 config: TransferConfig | None = None, credential: object = None, overwrite: bool = True,
                 thread_count: int | None = None, incremental: bool = False,
                 base: str | os.PathLike[str] | None = None, put_md5: bool = False, zip_crc32: bool = False
                 ) -> None:
        super().__init__()
        if thread_count is not None and (isinstance(thread_count, bool) or not isinstance(thread_count, int)
                                         or thread_count < 1):
            raise UsageError(f"invalid thread_count={thread_count!r}: how many blobs a rank writes at once, 1 or more")
        for name, flag in (("incremental", incremental), ("put_md5", put_md5), ("zip_crc32", zip_crc32)):
            if not isinstance(flag, bool):
                raise UsageError(f"invalid {name}={flag!r}: True or False")
        if base is not None and not incremental:
            raise UsageError("base= names the earlier checkpoint of an incremental save: pass incremental=True too")
        self.folder = _Folder(url, client, config, credential)
        self.incremental = incremental
        self.put_md5, self.zip_crc32 = put_md5, zip_crc32
        self.base = base_path(self.folder.url, base) if base is not None else None
        self.written: list[FileResult] = []
        self.overwrite = overwrite
        self.thread_count = thread_count
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self.rank_local: int | None = None  # this rank's number in a save without collectives

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.folder.reset(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        # `dcp.save(..., use_collectives=False)`: each rank plans, writes and finishes alone, so each names its own
        # blobs `__<rank>_<n>.distcp` and its own `__<rank>.metadata`, as FileSystemWriter does.
        self.rank_local = rank if not kwargs.get("use_collectives", True) and isinstance(rank, int) else None
        if self.rank_local is None and not is_coordinator:
            return
        # The old metadata goes before any rank writes: a save killed half-way must not leave a complete-looking
        # checkpoint over blobs half rewritten. (The other ranks write only after the coordinator's plan.)
        client, stale = self.folder.client, self._stale_metadata()
        # overwrite=False keeps a complete checkpoint of either mode: this save would rewrite its blobs.
        if not self.overwrite and any(_exists(client, self.folder.name(relative)) for relative in stale):
            raise UsageError(f"{self.folder.display} holds a complete checkpoint already (overwrite=False)")
        for relative in stale:
            client.delete(self.folder.name(relative))

    def _metadata_name(self) -> str:
        return METADATA if self.rank_local is None else f"__{self.rank_local}{METADATA}"

    def _stale_metadata(self) -> list[str]:
        """The metadata this save makes stale: its own, and the other mode's (a loader prefers `.metadata` and
        falls back to `__<rank>.metadata`, so either one left would describe blobs this save rewrites)."""
        if self.rank_local is not None:
            return [self._metadata_name(), METADATA]
        blobs, _ = self.folder.client.ls_level(self.folder.name(""))
        names = (blob.name.rsplit("/", 1)[-1] for blob in blobs)
        return [METADATA, *sorted(n for n in names if _RANK_METADATA.fullmatch(n))]

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        from torch.distributed.checkpoint.filesystem import _StoragePrefix

        if self.rank_local is None:
            return plan
        return dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{self.rank_local}_"))

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        from torch.distributed.checkpoint.filesystem import _StoragePrefix

        return [plan if plan.storage_data is not None else
                dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{i}_")) for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        folder = self.folder
        opened: list[BlobWriter] = []

        def open_blob(relative: str) -> BlobWriter:
            writer = folder.client.open(folder.name(relative), "wb", config=self._config(relative))
            assert isinstance(writer, BlobWriter)
            opened.append(writer)
            return writer

        try:
            results = write_rank(open_blob, plan.storage_data.prefix, plan.items, planner, self.thread_count,
                                 self.zip_crc32)
        except BaseException:
            folder.close()
            raise
        self.written = [w.result for w in opened if w.result is not None]
        if self.rank_local is None and not self.is_coordinator:  # its part is done: the coordinator finishes
            folder.close()
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def _config(self, relative: str) -> TransferConfig:
        """A blob's: its whole MD5 or not (put_md5); an incremental save's, its block digests kept and its blocks
        compared with its namesake's in `base`."""
        config = dataclasses.replace(self.folder.client.aio.config, put_md5=self.put_md5)
        if not self.incremental:
            return config
        return dataclasses.replace(config, block_digests=True,
                                   blocks_from=self.base + relative if self.base is not None else None)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage: dict[MetadataIndex, Any] = {}
        for rank_results in results:
            storage.update({r.index: r.storage_data for r in rank_results})
        _check_parts(self.folder, storage.values())
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = storage
        metadata.storage_meta = metadata.storage_meta or self.storage_meta()
        # Last, and in one request: a reader sees the checkpoint whole or not at all.
        try:
            self.folder.client.put(pickle.dumps(metadata), self.folder.name(self._metadata_name()),
                                   dataclasses.replace(self.folder.client.aio.config, overwrite=Overwrite.TRUE))
        finally:
            self.folder.close()

    def close(self) -> None:
        """Close the session this writer opened (DCP's save closes it once the rank's part is done)."""
        self.folder.close()

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.folder.display, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _is_blob_url(checkpoint_id)


class BlobStorageReader(StorageReader):
    """DCP's storage for a load from a folder URL on Blob: a checkpoint of BlobStorageWriter, of DCP's own
    FileSystemWriter (uploaded), or of blobsync's earlier format. Each blob's ranges are read merged, in parallel
    under the Client's budgets, each checked as it arrives, large tensors straight into tensor memory. A folder
    without a complete checkpoint is refused here, with one line (IncompleteCheckpointError), before DCP starts.
    Non-tensor values (which DCP's planner unpickles with weights_only=False) are refused where they name anything
    torch.load's weights_only does not build; `weights_only=False` lifts that for a folder you trust."""

    def __init__(self, url: str | os.PathLike[str], *, client: Client | None = None,
                 config: TransferConfig | None = None, credential: object = None, weights_only: bool = True,
                 rank: int | None = None) -> None:
        super().__init__()
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise UsageError(f"invalid rank={rank!r}: the rank whose own state to read (0 or more), of a checkpoint "
                             "saved with use_collectives=False")
        self.weights_only = bool(weights_only)
        self.rank = rank
        self.folder = _Folder(url, client, config, credential)
        self.storage: dict[MetadataIndex, Any] = {}
        self.load_id = uuid.uuid4().hex
        self._read = ""  # the metadata blob read, and its ETag
        self._version = ""
        self._pinned: dict[str, str | None] = {}  # each data blob's version, as it was under that metadata
        self._metadata: Metadata | None = self._first_metadata()  # a bad folder is one line here, before DCP starts

    def _first_metadata(self) -> Metadata | None:
        """The checkpoint's `.metadata`; None where only ranks' own are there (a save without collectives: which
        one is read is known when DCP asks)."""
        try:
            return self._read_metadata(self.rank)
        except IncompleteCheckpointError:
            if self.rank is None and _exists(self.folder.client, self.folder.name(f"__0{METADATA}")):
                return None
            raise

    @property
    def per_rank(self) -> bool:
        """Whether the folder holds ranks' own metadata and no `.metadata` (a save without collectives)."""
        return self._read != METADATA

    def _incomplete(self, name: str = METADATA) -> IncompleteCheckpointError:
        return IncompleteCheckpointError(
            f"no complete checkpoint at {self.folder.display}: its {name} is missing (a save that did not "
            "finish leaves none)", status=404, code="BlobNotFound",
            hint="load an earlier checkpoint, or save this one again")

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        changed = checkpoint_id is not None and folder_url(checkpoint_id) != self.folder.url
        self.folder.reset(checkpoint_id)
        self.storage = {}
        self.load_id = uuid.uuid4().hex
        self._pinned = {}
        if changed:
            self._metadata = self._first_metadata()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's `.metadata`; with `rank=` (DCP asks so when there is none) that rank's own, of a save
        without collectives (the reader's `rank`, where given, whatever the process's)."""
        rank = self.rank if self.rank is not None else kwargs.get("rank")
        metadata, self._metadata = self._metadata or self._read_metadata(rank), None
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _read_metadata(self, rank: int | None) -> Metadata:
        relative = METADATA if rank is None else f"__{rank}{METADATA}"
        name = self.folder.name(relative)
        try:
            props = self.folder.client.stat(name)
            data = self.folder.client.read_into(name, bytearray(props.size), etag=props.etag or None)
        except BlobNotFoundError:
            raise self._incomplete(relative) from None
        self._read, self._version = relative, props.etag
        metadata = load_metadata(bytes(data), f"{self.folder.display}{relative}")
        if not isinstance(metadata, Metadata):
            raise IntegrityError(f"{self.folder.display}{relative} is not a checkpoint's metadata")
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        storage = metadata.storage_data
        if not isinstance(storage, dict) or not all(_placed(info) for info in storage.values()):
            raise IntegrityError(f"{self.folder.display}{self._read} does not say where each item's bytes are (not a "
                                 "checkpoint of DCP's FileSystemWriter or blobsync's)")
        self.storage = storage

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        needs = [Need(req, self.storage[req.storage_index]) for req in plan.items]
        self._pin({need.info.relative_path for need in needs})
        client, folder, versions = self.folder.client, self.folder, self._pinned

        def fetch(relative: str, offset: int, into: memoryview) -> Any:
            return client.submit(client.aio.read_into, folder.name(relative), into, offset, etag=versions[relative])

        try:
            Loader(fetch, planner, self.weights_only).run(needs)
        finally:
            self.folder.close()  # the load is done: a reader used again opens a session then
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def close(self) -> None:
        """Close the session this reader opened (a load closes it when its reads are done)."""
        self.folder.close()

    def _pin(self, relatives: set[str]) -> None:
        """The version of each data blob read from here on: the one there while the metadata read is still there
        (a save deletes it before any rank writes), so no range comes from another save."""
        client = self.folder.client
        new = sorted(relatives - self._pinned.keys())
        if not new:
            return
        found = [client.stat(self.folder.name(relative)).etag or None for relative in new]
        try:
            still = client.stat(self.folder.name(self._read)).etag == self._version
        except BlobNotFoundError:
            still = False
        if not still:
            raise ConflictError(f"{self.folder.display}: the checkpoint is being saved again while it loads; load "
                                "it again once that save is done", status=412, code="ConditionNotMet")
        self._pinned.update(zip(new, found, strict=True))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _is_blob_url(checkpoint_id)


def _is_blob_url(checkpoint_id: str | os.PathLike[str]) -> bool:
    text = os.fspath(checkpoint_id)
    return isinstance(text, str) and is_remote(text)  # a URL of any store the backend registry knows


def _exists(client: Client, name: str) -> bool:
    try:
        client.stat(name)
    except BlobNotFoundError:
        return False
    return True


def _placed(info: object) -> bool:
    """A storage record a load can read: where an item's bytes are (DCP's _StorageInfo, blobsync's earlier one)."""
    return all(isinstance(getattr(info, f, None), t) for f, t in (("relative_path", str), ("offset", int),
                                                                    ("length", int)))


def _check_parts(folder: _Folder, infos: Sequence[Any] | Any) -> None:
    """Every blob the results name is there and holds the bytes they place in it (the ranks' commits landed)."""
    ends: dict[str, int] = {}
    for info in infos:
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for relative, end in sorted(ends.items()):
        try:
            size = folder.client.stat(folder.name(relative)).size
        except BlobNotFoundError:
            raise IntegrityError(f"{folder.display}{relative}: a rank's blob is missing: the checkpoint is not "
                                 "complete (no .metadata written)") from None
        if size < end:
            raise IntegrityError(f"{folder.display}{relative} holds {size} bytes, the ranks wrote {end}: no "
                                 ".metadata written")
