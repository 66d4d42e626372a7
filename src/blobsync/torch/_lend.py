"""torch.save's writes of a storage the caller's state holds, handed to a blob writer without a copy
(BlobWriter.write_borrowed), in a view that keeps the storage alive; every other write copied as usual."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from blobsync.backends.base import Buffer
from blobsync.blobfile import BlobWriter

LEND_BYTES = 1 << 20  # a storage from this size is sent from its own memory, not copied into blocks

try:  # the address of the memory torch.save hands over, and a view that keeps it alive (else it is copied)
    import numpy
except ImportError:  # pragma: no cover - torch runs without numpy
    numpy = None  # type: ignore[assignment]


class Lender:
    """A BlobWriter as torch.save writes to it. torch.save writes a storage in one write, from a view of its
    memory that does not keep it alive: where that is the memory of a storage offered here, whole, the writer
    gets an owning view of it instead, and sends its blocks from it (the caller keeps the storages unchanged
    until the writer closes)."""

    def __init__(self, writer: BlobWriter) -> None:
        self.writer = writer
        self._storages: dict[int, torch.UntypedStorage] = {}

    def offer(self, tensors: Iterable[torch.Tensor]) -> None:
        """The storages of these tensors (the CPU ones, of plain layout and LEND_BYTES or more) may be lent."""
        for tensor in tensors:
            if tensor.device.type != "cpu" or tensor.layout is not torch.strided or tensor.is_quantized:
                continue
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass without plain storage
                continue
            if storage.nbytes() >= LEND_BYTES:
                self._storages[storage.data_ptr()] = storage

    def withdraw(self) -> None:
        self._storages.clear()

    def write(self, data: Buffer) -> int:
        own = self._owned(data)
        return self.writer.write_borrowed(own) if own is not None else self.writer.write(data)

    def flush(self) -> None:
        pass

    def _owned(self, data: Buffer) -> memoryview | None:
        if not self._storages or numpy is None:
            return None
        view = memoryview(data)
        if view.nbytes < LEND_BYTES:
            return None
        storage = self._storages.get(numpy.frombuffer(view, numpy.uint8).ctypes.data)
        if storage is None or storage.nbytes() != view.nbytes:
            return None
        return memoryview(torch.empty(0, dtype=torch.uint8).set_(storage).numpy().data)  # the array holds it


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of a state: in it, or in its dicts, lists and tuples, however deep."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_in(item)
