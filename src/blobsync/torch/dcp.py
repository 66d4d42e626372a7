"""PyTorch Distributed Checkpoint (DCP) on Blob: BlobStorageWriter and BlobStorageReader, so that
`dcp.save(state, storage_writer=BlobStorageWriter(url))` and `dcp.load` work unchanged.

Each rank writes one blob of its own (`__<rank>_0.distcp`), straight from tensor memory into blocks staged under
the Client's budgets with their checks, committed once with the whole MD5 and verified; the coordinator writes
`.metadata` last, after checking that every rank's blob is there with the bytes its results name. A checkpoint
without `.metadata` is incomplete, and the reader refuses it with one line."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from blobsync.backends.base import Buffer
from blobsync.backends.registry import is_remote
from blobsync.blobfile import BlobWriter
from blobsync.client import Client
from blobsync.config import Overwrite, TransferConfig
from blobsync.errors import BlobNotFoundError, ConflictError, IntegrityError, UsageError
from blobsync.redact import strip_query
from blobsync.torch._paths import below, folder_url
from blobsync.torch._unpickle import load_metadata

METADATA = ".metadata"
SUFFIX = ".distcp"


class IncompleteCheckpointError(BlobNotFoundError):
    """A checkpoint folder without its `.metadata`: a save that never finished (or no checkpoint at all)."""


@dataclass(frozen=True)
class BlobStorageInfo:
    """Where one item's bytes are: a blob of the checkpoint folder, the range in it, and (tensors) how to view
    them: the raw bytes of a contiguous tensor of `dtype` and `shape`."""

    relative_path: str
    offset: int
    length: int
    dtype: str | None = None  # None: the bytes of a BYTE_IO item
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Prefix:
    prefix: str  # the names a rank's blobs start with


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise IntegrityError(f"the checkpoint names an unknown tensor type {name!r}")
    return dtype


class _Folder:
    """One checkpoint folder on Blob, through a Client whose URL is the folder (names are relative to it)."""

    def __init__(self, url: str | os.PathLike[str], client: Client | None, config: TransferConfig | None,
                 credential: object) -> None:
        self.url = folder_url(url)
        self._given = client
        self.client = client if client is not None else Client(self.url, config, credential=credential)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        if checkpoint_id is not None and folder_url(checkpoint_id) != self.url:
            self.url = folder_url(checkpoint_id)
            self.client = self._given if self._given is not None else Client(self.url, self.client.aio.config,
                                                                               credential=self.client.aio.credential)

    def name(self, relative: str) -> str:
        """`relative` under the folder, as the Client names it (a Client of the folder itself, or a given one)."""
        return below(self.client, self.url) + relative

    @property
    def display(self) -> str:
        return strip_query(self.url)


class BlobStorageWriter(StorageWriter):
    """DCP's storage for a save to a folder URL on Blob (a SAS in it, or `credential`, or the environment's).
    `client` shares an existing Client's session (budgets, connections); `config` sets block size, memory and
    concurrency of one made here. `overwrite=False` refuses a folder that holds a complete checkpoint already."""

    def __init__(self, url: str | os.PathLike[str], *, client: Client | None = None,
                 config: TransferConfig | None = None, credential: object = None, overwrite: bool = True) -> None:
        super().__init__()
        self.folder = _Folder(url, client, config, credential)
        self.overwrite = overwrite
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.folder.reset(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        if not is_coordinator:
            return
        # The old `.metadata` goes before any rank writes: a save killed half-way must not leave a complete-looking
        # checkpoint over blobs half rewritten. (The other ranks write only after the coordinator's plan.)
        client, name = self.folder.client, self.folder.name(METADATA)
        if not self.overwrite and _exists(client, name):
            raise UsageError(f"{self.folder.display} holds a complete checkpoint already (overwrite=False)")
        client.delete(name)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=_Prefix(f"__{i}_")) for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix: _Prefix = plan.storage_data
        relative = f"{prefix.prefix}0{SUFFIX}"
        results = _write_blob(self.folder.client, self.folder.name(relative), relative, plan.items, planner)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage: dict[MetadataIndex, BlobStorageInfo] = {}
        for rank_results in results:
            storage.update({r.index: r.storage_data for r in rank_results})
        _check_parts(self.folder, storage.values())
        metadata.storage_data = storage
        metadata.storage_meta = metadata.storage_meta or self.storage_meta()
        # Last, and in one request: a reader sees the checkpoint whole or not at all.
        self.folder.client.put(pickle.dumps(metadata), self.folder.name(METADATA),
                               dataclasses.replace(self.folder.client.aio.config, overwrite=Overwrite.TRUE))

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.folder.display, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _is_blob_url(checkpoint_id)


class BlobStorageReader(StorageReader):
    """DCP's storage for a load from a folder URL on Blob: the ranges each rank needs are read in parallel under
    the Client's budgets, each checked as it arrives, straight into tensor memory. A folder without a complete
    checkpoint is refused here, with one line (IncompleteCheckpointError), before DCP starts."""

    def __init__(self, url: str | os.PathLike[str], *, client: Client | None = None,
                 config: TransferConfig | None = None, credential: object = None) -> None:
        super().__init__()
        self.folder = _Folder(url, client, config, credential)
        self.storage: dict[MetadataIndex, BlobStorageInfo] = {}
        self.load_id = uuid.uuid4().hex
        self._version = ""  # the ETag of the `.metadata` read
        self._pinned: dict[str, str | None] = {}  # each data blob's version, as it was under that `.metadata`
        self._metadata: Metadata | None = self._read_metadata()  # a bad folder is one line here, before DCP starts

    def _incomplete(self) -> IncompleteCheckpointError:
        return IncompleteCheckpointError(
            f"no complete checkpoint at {self.folder.display}: its {METADATA} is missing (a save that did not "
            "finish leaves none)", status=404, code="BlobNotFound",
            hint="load an earlier checkpoint, or save this one again")

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        changed = checkpoint_id is not None and folder_url(checkpoint_id) != self.folder.url
        self.folder.reset(checkpoint_id)
        self.storage = {}
        self.load_id = uuid.uuid4().hex
        self._pinned = {}
        if changed:
            self._metadata = None

    def read_metadata(self) -> Metadata:  # no rank-local metadata: DCP then asks for the global one only
        metadata, self._metadata = self._metadata or self._read_metadata(), None
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _read_metadata(self) -> Metadata:
        name = self.folder.name(METADATA)
        try:
            props = self.folder.client.stat(name)
            data = self.folder.client.read_into(name, bytearray(props.size), etag=props.etag or None)
        except BlobNotFoundError:
            raise self._incomplete() from None
        self._version = props.etag
        metadata = load_metadata(bytes(data), f"{self.folder.display}{METADATA}")
        if not isinstance(metadata, Metadata):
            raise IntegrityError(f"{self.folder.display}{METADATA} is not a checkpoint's metadata")
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not isinstance(metadata.storage_data, dict):
            raise IntegrityError(f"{self.folder.display}{METADATA} was not written by BlobStorageWriter")
        self.storage = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        items = [(req, self.storage[req.storage_index]) for req in plan.items]
        # A tensor the checkpoint holds whole, bound for a contiguous CPU tensor of its type and shape, is read
        # straight into it; the others into a buffer of their own, then copied in.
        targets = [_direct(planner, req, info) for req, info in items]
        self._pin({info.relative_path for _, info in items})
        raws = _read_ranges(self.folder, [info for _, info in items], targets, self._pinned)
        for (req, info), raw, target in zip(items, raws, targets, strict=True):
            if target is not None:
                planner.commit_tensor(req, target)
            else:
                _load_item(planner, req, info, raw)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _pin(self, relatives: set[str]) -> None:
        """The version of each data blob read from here on: the one there while the `.metadata` read is still
        there (a save deletes it before any rank writes), so no range comes from another save."""
        client = self.folder.client
        new = sorted(relatives - self._pinned.keys())
        if not new:
            return
        found = [client.stat(self.folder.name(relative)).etag or None for relative in new]
        try:
            still = client.stat(self.folder.name(METADATA)).etag == self._version
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


def _view(raw: torch.Tensor) -> memoryview:
    """The memory of a contiguous uint8 CPU tensor, as a memoryview (no copy)."""
    return memoryview(cast(Buffer, raw.numpy())).cast("B")


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor's contiguous CPU form, as a view of its memory (no copy when it is one already)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return _view(flat.view(torch.uint8))


def _write_blob(client: Client, name: str, relative: str, items: Sequence[WriteItem], planner: SavePlanner
                ) -> list[WriteResult]:
    """One rank's items written into one blob, each at the next offset; committed (and verified) before return."""
    writer = client.open(name, "wb")
    assert isinstance(writer, BlobWriter)
    results: list[WriteResult] = []
    offset = 0
    try:
        for item in items:
            data = planner.resolve_data(item)
            if item.type is WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                view, info = data.getbuffer(), BlobStorageInfo(relative, offset, data.getbuffer().nbytes)
            else:
                assert isinstance(data, torch.Tensor)
                view = _tensor_bytes(data)
                info = BlobStorageInfo(relative, offset, view.nbytes, str(data.dtype), tuple(data.shape))
            writer.write(view)
            results.append(WriteResult(index=item.index, size_in_bytes=info.length, storage_data=info))
            offset += info.length
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return results


def _check_parts(folder: _Folder, infos: Sequence[BlobStorageInfo] | Any) -> None:
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


def _direct(planner: LoadPlanner, req: ReadItem, info: BlobStorageInfo) -> torch.Tensor | None:
    """The tensor an item can be read straight into (all of the stored chunk, into memory laid out as stored)."""
    if req.type is not LoadItemType.TENSOR or info.dtype is None or any(req.storage_offsets) or \
            tuple(req.lengths) != info.shape:
        return None
    target = planner.resolve_tensor(req).detach()
    if target.device.type != "cpu" or not target.is_contiguous() or str(target.dtype) != info.dtype or \
            tuple(target.shape) != info.shape:
        return None
    return target


def _read_ranges(folder: _Folder, infos: Sequence[BlobStorageInfo], targets: Sequence[torch.Tensor | None],
                 versions: dict[str, str | None]) -> list[torch.Tensor]:
    """The bytes of each item, all ranges in flight at once, each of its blob's pinned version: into its target's
    memory, or a uint8 tensor."""
    raws = [t.reshape(-1).view(torch.uint8) if t is not None else torch.empty(info.length, dtype=torch.uint8)
            for info, t in zip(infos, targets, strict=True)]
    client = folder.client
    futures = [client.submit(client.aio.read_into, folder.name(info.relative_path), _view(raw), info.offset,
                             etag=versions[info.relative_path])
               for info, raw in zip(infos, raws, strict=True) if info.length]
    for future in futures:
        future.result()
    return raws


def _load_item(planner: LoadPlanner, req: ReadItem, info: BlobStorageInfo, raw: torch.Tensor) -> None:
    if req.type is LoadItemType.BYTE_IO:
        planner.load_bytes(req, io.BytesIO(raw.numpy().tobytes()))
        return
    if info.dtype is None:
        raise IntegrityError(f"{info.relative_path}: item {req.storage_index.fqn!r} is bytes, not a tensor")
    tensor = raw.view(_dtype(info.dtype)).reshape(info.shape)
    for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
        tensor = tensor.narrow(dim, start, length)
    target = planner.resolve_tensor(req).detach()
    if target.size() != tensor.size():
        raise IntegrityError(f"{req.storage_index.fqn}: the checkpoint holds {tuple(tensor.size())} for "
                             f"{tuple(target.size())}")
    target.copy_(tensor)
    planner.commit_tensor(req, target)
