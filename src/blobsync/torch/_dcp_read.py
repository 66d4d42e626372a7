"""A DCP load's reads, planned per blob: near ranges merged into one ranged read (each byte read once, at most the
merged gaps besides), a large tensor read straight into the tensor it loads into, the rest copied in from the
merged buffers; items in DCP's own format (`torch.save` of a tensor) and in blobsync's earlier raw format."""

from __future__ import annotations

import concurrent.futures
import io
import pickle
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from blobsync.backends.base import Buffer
from blobsync.errors import IntegrityError
from blobsync.torch import _torchsave
from blobsync.torch._torchsave import SavedTensor

MERGE_GAP = 1 << 20  # two ranges of a blob this close are read as one: a GET costs more than a MiB in flight
DIRECT_MIN = 2 << 20  # a tensor this large is read straight into its target (never inside a merged gap: > GAP)
BATCH = 256 << 20  # bytes of merged ranges in flight at once: the load's memory beyond its tensors
Fetch = Callable[[str, int, memoryview], "concurrent.futures.Future[Any]"]  # (blob, offset, into) -> done


@dataclass
class Need:
    """One item of the plan and where its bytes are; `target` the tensor it may be read straight into."""

    req: ReadItem
    info: Any  # DCP's _StorageInfo, or blobsync's earlier BlobStorageInfo (raw bytes, dtype and shape)
    target: torch.Tensor | None = None
    head: memoryview | None = None  # a large item's first bytes
    saved: SavedTensor | None = None  # where they say its tensor's bytes are

    @property
    def raw(self) -> bool:
        return getattr(self.info, "dtype", None) is not None  # blobsync's earlier format: the tensor's bytes

    @property
    def transforms(self) -> Sequence[str]:
        return getattr(self.info, "transform_descriptors", None) or ()


@dataclass
class _Range:
    blob: str
    start: int
    end: int
    needs: list[tuple[Need, int, int]]  # each need, and the span of it this range holds (offset, length)


def view_of(tensor: torch.Tensor) -> memoryview:
    """The memory of a contiguous CPU tensor, as bytes (no copy)."""
    return memoryview(cast(Buffer, tensor.reshape(-1).view(torch.uint8).numpy())).cast("B")


def merged(spans: Sequence[tuple[Need, int, int]], gap: int = MERGE_GAP) -> list[_Range]:
    """`spans` (need, offset, length) grouped by blob and merged where they touch or lie within `gap`."""
    out: list[_Range] = []
    for need, offset, length in sorted(spans, key=lambda s: (s[0].info.relative_path, s[1])):
        blob, end = need.info.relative_path, offset + length
        last = out[-1] if out else None
        if last is not None and last.blob == blob and offset - last.end <= gap:
            last.end = max(last.end, end)
            last.needs.append((need, offset, length))
        else:
            out.append(_Range(blob, offset, end, [(need, offset, length)]))
    return out


def whole_target(planner: LoadPlanner, req: ReadItem) -> torch.Tensor | None:
    """The tensor an item loads into, where all of the stored chunk lands in it: a CPU tensor laid out row-major."""
    if req.type is not LoadItemType.TENSOR or any(req.storage_offsets):
        return None
    target = planner.resolve_tensor(req).detach()
    if target.device.type != "cpu" or not target.is_contiguous() or tuple(target.shape) != tuple(req.lengths):
        return None
    return target


class Loader:
    """Reads one rank's plan: small items and the first bytes of large ones in merged ranges, then each large
    tensor straight into its target (or whole, where it cannot be)."""

    def __init__(self, fetch: Fetch, planner: LoadPlanner, weights_only: bool = True) -> None:
        self.fetch, self.planner, self.weights_only = fetch, planner, weights_only

    def run(self, needs: Sequence[Need]) -> None:
        first: list[tuple[Need, int, int]] = []
        direct: list[Need] = []
        for need in needs:
            need.target = whole_target(self.planner, need.req) if need.info.length >= DIRECT_MIN else None
            if need.target is not None and need.raw:  # raw bytes: the tensor's, where its type and shape match
                if str(need.target.dtype) == need.info.dtype and tuple(need.target.shape) == tuple(need.info.shape):
                    direct.append(need)
                    continue
                need.target = None
            if need.target is not None and not need.transforms:
                first.append((need, need.info.offset, min(_torchsave.HEAD, need.info.length)))
            else:
                first.append((need, need.info.offset, need.info.length))
        heads = self._read(merged(first))
        whole: list[tuple[Need, int, int]] = []
        for need in heads:
            assert need.head is not None
            need.saved = _torchsave.parse(need.head)
            if need.saved is not None and _fits(need.saved, need.target):
                direct.append(need)
            else:
                need.target, need.head = None, None
                whole.append((need, need.info.offset, need.info.length))
        self._direct(direct)
        self._read(merged(whole, 0))

    def _read(self, ranges: list[_Range]) -> list[Need]:
        """Each range read into a buffer of its own (at most BATCH bytes in flight), its items loaded from it;
        returns the items of which only the first bytes were read (kept on them as `head`)."""
        heads: list[Need] = []
        for batch in _batches(ranges):
            bufs = [torch.empty(r.end - r.start, dtype=torch.uint8) for r in batch]
            for f in [self.fetch(r.blob, r.start, view_of(b)) for r, b in zip(batch, bufs, strict=True) if len(b)]:
                f.result()
            for r, buf in zip(batch, bufs, strict=True):
                for need, offset, length in r.needs:
                    part = buf[offset - r.start:offset - r.start + length]
                    if length < need.info.length:
                        need.head = memoryview(view_of(part).tobytes())
                        heads.append(need)
                    else:
                        self._load(need, part)
        return heads

    def _direct(self, needs: list[Need]) -> None:
        """Large tensors read straight into their targets, all at once (each in parallel ranges); of a torch.save
        item, the part of the tensor its first bytes held already is copied from them, not read again."""
        futures = []
        for need in needs:
            assert need.target is not None
            into, at = view_of(need.target), need.info.offset
            if need.saved is not None and need.head is not None:
                held = max(0, min(len(need.head) - need.saved.data_offset, len(into)))
                into[:held] = need.head[need.saved.data_offset:need.saved.data_offset + held]
                into, at = into[held:], at + need.saved.data_offset + held
            if len(into):
                futures.append(self.fetch(need.info.relative_path, at, into))
        for f in futures:
            f.result()
        for need in needs:
            assert need.target is not None
            need.head = None
            self.planner.commit_tensor(need.req, need.target)

    def _load(self, need: Need, raw: torch.Tensor) -> None:
        """One item from its bytes (a uint8 tensor): bytes handed over, a tensor copied into its target."""
        req = need.req
        if req.type is LoadItemType.BYTE_IO:
            data = _stream(need, raw)
            if self.weights_only:
                _only_weights(need, data)
            self.planner.load_bytes(req, data)
            return
        tensor = _tensor(need, raw)
        for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
            tensor = tensor.narrow(dim, start, length)
        target = self.planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise IntegrityError(f"{req.storage_index.fqn}: the checkpoint holds {tuple(tensor.size())} for "
                                 f"{tuple(target.size())}")
        target.copy_(tensor)
        self.planner.commit_tensor(req, target)


def _fits(saved: SavedTensor, target: torch.Tensor | None) -> bool:
    return target is not None and saved.compact and saved.dtype == target.dtype and \
        saved.size == tuple(target.shape)


def _batches(ranges: list[_Range]) -> Iterator[list[_Range]]:
    batch: list[_Range] = []
    size = 0
    for r in ranges:
        if batch and size + (r.end - r.start) > BATCH:
            yield batch
            batch, size = [], 0
        batch.append(r)
        size += r.end - r.start
    if batch:
        yield batch


def _stream(need: Need, raw: torch.Tensor) -> io.BytesIO:
    """An item's bytes as DCP hands them on, undone from the transforms its writer applied (compression)."""
    data = io.BytesIO(view_of(raw).tobytes())
    if not need.transforms:
        return data
    from torch.distributed.checkpoint.filesystem import _StorageReaderTransforms

    return io.BytesIO(_StorageReaderTransforms().transform_load_stream(need.req, need.transforms, data).read())


def _weights_only_load(need: Need, data: io.BytesIO) -> object:
    """torch.load of an item's bytes with weights_only (plain values, tensors, BytesIO); an item naming anything
    else (a function loading would call) is refused with one line, nothing run."""
    try:
        with torch.serialization.safe_globals([io.BytesIO]):
            return torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = found.group(1) if found else "a callable"
        raise IntegrityError(f"{need.info.relative_path}: item {need.req.storage_index.fqn!r} names {what}, which "
                             "loading would run: refused. Load checkpoints only from folders nobody else can write "
                             "to; for one you trust with such values, pass weights_only=False") from None


def _only_weights(need: Need, data: io.BytesIO) -> None:
    """A bytes item (DCP's planner unpickles it with weights_only=False) refused where it names anything beyond
    what torch.load's weights_only builds: a planted item runs nothing."""
    try:
        _weights_only_load(need, data)
    except IntegrityError:
        raise
    except Exception:  # not torch.save's bytes (another planner's): the planner decides
        pass
    data.seek(0)


def _tensor(need: Need, raw: torch.Tensor) -> torch.Tensor:
    """The stored tensor an item's bytes hold: blobsync's earlier raw bytes, or torch.save's (read in place where
    it is one plain tensor; else torch.load with weights_only, which runs nothing the bytes name)."""
    info = need.info
    if need.raw:
        dtype = getattr(torch, str(info.dtype).removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise IntegrityError(f"the checkpoint names an unknown tensor type {info.dtype!r}")
        if (raw.storage_offset() | raw.data_ptr()) % dtype.itemsize:  # placed by an earlier writer, unaligned
            raw = raw.clone()
        return raw.view(dtype).reshape(info.shape)
    saved = None if need.transforms else _torchsave.parse(view_of(raw))
    if saved is not None:
        return saved.tensor(raw)
    loaded = _weights_only_load(need, _stream(need, raw))
    if not isinstance(loaded, torch.Tensor):
        raise IntegrityError(f"{info.relative_path}: item {need.req.storage_index.fqn!r} holds "
                             f"{type(loaded).__name__}, not a tensor")
    return loaded
