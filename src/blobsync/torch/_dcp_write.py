"""One rank's DCP items written as DCP's own FileSystemWriter writes them (a tensor as `torch.save` of it, bytes
as they are, `_StorageInfo` records), spread over several blobs written at once (`__<rank>_<n>.distcp`)."""

from __future__ import annotations

import concurrent.futures
import io
import os
from collections.abc import Callable, Sequence

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from blobsync.backends.base import Buffer
from blobsync.blobfile import BlobWriter
from blobsync.torch._lend import Lender

SUFFIX = ".distcp"
ALIGN = 64  # items start 64-byte aligned, as torch.save aligns a tensor's bytes in its item: a load views them in
# place whatever their type, and a stock reader (which slices by offset and length) never notices
FILE_BYTES = 128 << 20  # a rank's state is spread over one blob per this many bytes, up to one per core


def item_size(item: WriteItem) -> int:
    """The bytes of a tensor item (what its blob is balanced on); 0 for bytes."""
    if item.tensor_data is None:
        return 0
    size = item.tensor_data.properties.dtype.itemsize
    for n in item.tensor_data.size:
        size *= n
    return size


def buckets(items: Sequence[WriteItem], files: int | None) -> list[list[WriteItem]]:
    """`items` spread over `files` blobs (None: by size, see FILE_BYTES), the largest tensors first onto the
    lightest, bytes items round the blobs: each blob about the same size, as FileSystemWriter's thread_count does."""
    total = sum(item_size(i) for i in items)
    n = files if files is not None else min(os.cpu_count() or 1, max(1, total // FILE_BYTES))
    n = max(1, min(n, len(items)))
    out: list[list[WriteItem]] = [[] for _ in range(n)]
    sizes = [0] * n
    for i, item in enumerate(i for i in items if i.type is WriteItemType.BYTE_IO):
        out[i % n].append(item)
    for item in sorted((i for i in items if i.type is not WriteItemType.BYTE_IO), key=item_size, reverse=True):
        lightest = sizes.index(min(sizes))
        out[lightest].append(item)
        sizes[lightest] += item_size(item)
    return [b for b in out if b]


class _Counted(Lender):
    """A BlobWriter as torch.save writes to it, counting the bytes (where the next item starts); the storage of
    the state's tensor being saved is lent (sent from its memory, not copied: the state stays unchanged while the
    save runs)."""

    def __init__(self, writer: BlobWriter) -> None:
        super().__init__(writer)
        self.at = 0

    def write(self, data: Buffer) -> int:
        n = super().write(data)
        self.at += n
        return n

    def pad(self) -> None:
        if self.at % ALIGN:
            self.write(bytes(ALIGN - self.at % ALIGN))


def cpu_tensor(data: torch.Tensor) -> torch.Tensor:
    """The tensor as it is saved: on the CPU, row-major, its storage no larger than it (a view of a larger tensor
    would otherwise save all of that tensor's storage)."""
    tensor = data.detach().cpu().contiguous()
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        tensor = tensor.clone()
    return tensor


def write_file(open_blob: Callable[[], BlobWriter], relative: str, items: Sequence[WriteItem],
               planner: SavePlanner, crc32: bool = False) -> list[WriteResult]:
    """`items` written into one blob, each at the next aligned offset; committed (and verified) before return.
    `crc32=False` leaves out torch.save's CRC32 of each zip record, a serial pass over the bytes that torch.load
    never checks (the blob's CRC64s are what is checked); the setting is torch's per thread, a caller's untouched."""
    from torch.utils.serialization import config

    writer = open_blob()
    try:
        with config.patch({"save.compute_crc32": crc32}):  # type: ignore[attr-defined]  # made at import
            results = _write_items(_Counted(writer), relative, items, planner)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return results


def _write_items(out: _Counted, relative: str, items: Sequence[WriteItem], planner: SavePlanner
                 ) -> list[WriteResult]:
    results: list[WriteResult] = []
    for item in items:
        out.pad()
        start = out.at
        data = planner.resolve_data(item)
        if item.type is WriteItemType.BYTE_IO:
            assert isinstance(data, io.BytesIO)
            out.write(data.getbuffer())
        else:
            assert isinstance(data, torch.Tensor)
            tensor = cpu_tensor(data)
            # Only the state's own memory is lent: a copy made here (from a GPU, of a strided view) would be kept
            # alive until its blocks are sent while the next item's copy is made; copied into blocks, it is not.
            if tensor.untyped_storage().data_ptr() == data.untyped_storage().data_ptr():
                out.offer([tensor])
            try:
                torch.save(tensor, out)  # type: ignore[arg-type]  # a file-like object: write, flush
            finally:
                out.withdraw()
        results.append(WriteResult(index=item.index, size_in_bytes=out.at - start,
                                   storage_data=_StorageInfo(relative, start, out.at - start)))
    return results


def write_rank(open_blob: Callable[[str], BlobWriter], prefix: str, items: Sequence[WriteItem],
               planner: SavePlanner, files: int | None, crc32: bool = False) -> list[WriteResult]:
    """A rank's items over its blobs (`<prefix><n>.distcp`), written at once, one thread each (torch.save
    blocks); every blob committed before return, or none left half-written. `crc32`: each item's zip records carry
    their CRC32, as torch.save's defaults write them."""
    parts = buckets(items, files)
    names = [f"{prefix}{n}{SUFFIX}" for n in range(len(parts))]
    if len(parts) <= 1:
        return write_file(lambda: open_blob(names[0]), names[0], parts[0], planner, crc32) if parts else []
    with concurrent.futures.ThreadPoolExecutor(len(parts), thread_name_prefix="blobsync-dcp") as pool:
        futures = [pool.submit(write_file, lambda name=name: open_blob(name), name, part, planner,  # type: ignore[misc]
                               crc32)
                   for name, part in zip(names, parts, strict=True)]
        return [r for f in futures for r in f.result()]
