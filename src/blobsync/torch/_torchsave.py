"""One tensor's `torch.save` bytes (a DCP item) read without running their pickle: where the tensor's bytes sit in
the item, and their type, shape and strides; anything else in the pickle is refused, and the caller falls back to
`torch.load(weights_only=True)`."""

from __future__ import annotations

import io
import math
import pickle
import struct
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

_LOCAL = b"PK\x03\x04"  # a zip local file header's signature
_HEADER = struct.Struct("<4s5H3L2H")  # signature, version, flags, method, time, date, crc, sizes, name, extra
HEAD = 4096  # bytes from an item's start that hold its pickle and its data record's header (~700 in practice)


@dataclass(frozen=True)
class SavedTensor:
    """A tensor as one torch.save item holds it: its storage's bytes at `data_offset` from the item's start."""

    data_offset: int
    storage_bytes: int
    dtype: torch.dtype
    storage_offset: int  # in elements
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.size) * self.dtype.itemsize

    @property
    def compact(self) -> bool:
        """The storage is exactly the tensor, row-major: its bytes can be read straight into a tensor like it."""
        return self.storage_offset == 0 and self.storage_bytes == self.nbytes and \
            self.stride == _row_major(self.size)

    def tensor(self, item: torch.Tensor) -> torch.Tensor:
        """The tensor over `item` (a uint8 tensor of the item's bytes; no copy where it is aligned for the type)."""
        if not self.storage_bytes:
            return torch.empty(self.size, dtype=self.dtype)
        data = item[self.data_offset:self.data_offset + self.storage_bytes]
        if (data.storage_offset() | data.data_ptr()) % self.dtype.itemsize:
            data = data.clone()
        typed = data.view(self.dtype)
        return typed.as_strided(self.size, self.stride, typed.storage_offset() + self.storage_offset)


def _row_major(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class _Refused(Exception):
    pass


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: torch.dtype
    numel: int


@dataclass(frozen=True)
class _Rebuilt:
    storage: _Storage
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def _rebuild_v2(storage: _Storage, offset: int, size: Any, stride: Any, *_: Any) -> _Rebuilt:
    return _Rebuilt(storage, offset, tuple(size), tuple(stride), storage.dtype)


def _rebuild_v3(storage: _Storage, offset: int, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any,
                *_: Any) -> _Rebuilt:
    if not isinstance(dtype, torch.dtype):
        raise _Refused("dtype")
    return _Rebuilt(storage, offset, tuple(size), tuple(stride), dtype)


class _TensorUnpickler(pickle.Unpickler):
    """Builds only the record of a plain tensor: a rebuild call, a storage type or dtype, an empty hook dict."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuild_v2 if name.endswith("v2") else _rebuild_v3
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch.storage" and name == "UntypedStorage":
            return torch.uint8
        found = getattr(torch, name, None) if module == "torch" else None
        if isinstance(found, torch.dtype):
            return found
        if name.endswith("Storage") and found is not None:
            with warnings.catch_warnings():  # the legacy storage classes warn on any use
                warnings.simplefilter("ignore")
                dtype = getattr(found, "dtype", None)
            if isinstance(dtype, torch.dtype):
                return dtype
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], torch.dtype)
                and isinstance(pid[2], str) and isinstance(pid[4], int)):
            raise _Refused("a persistent id")
        return _Storage(pid[2], pid[1], pid[4])


def _record(data: memoryview, at: int) -> tuple[str, int, int] | None:
    """The zip local header at `at`: (name, where its data starts, its stored size or 0 when deferred)."""
    if at + _HEADER.size > len(data) or bytes(data[at:at + 4]) != _LOCAL:
        return None
    fields = _HEADER.unpack_from(data, at)
    name_len, extra_len, size = fields[9], fields[10], fields[7]
    start = at + _HEADER.size
    name = bytes(data[start:start + name_len]).decode("utf-8", "replace")
    return name, start + name_len + extra_len, size if fields[2] & 8 == 0 else 0


def parse(item: memoryview) -> SavedTensor | None:
    """Where the tensor of a torch.save item (its first bytes, HEAD or more) keeps its bytes, or None where the item
    is not one plain tensor this reads (a subclass, hooks, a dict...) or `item` stops before its data."""
    first = _record(item, 0)
    if first is None or not first[0].endswith("/data.pkl"):
        return None
    prefix = first[0].removesuffix("data.pkl")
    stream = io.BytesIO(item[first[1]:])
    try:
        rebuilt = _TensorUnpickler(stream).load()
    except Exception:  # truncated, refused, or not a pickle: the stock reader decides
        return None
    if not isinstance(rebuilt, _Rebuilt) or rebuilt.storage.dtype not in (rebuilt.dtype, torch.uint8):
        return None
    storage_bytes = rebuilt.storage.numel * rebuilt.storage.dtype.itemsize
    at = first[1] + stream.tell()
    want = f"{prefix}data/{rebuilt.storage.key}"
    head = bytes(item[:at + HEAD])  # the records between (version, byteorder, alignment) are a few hundred bytes
    while (at := head.find(_LOCAL, at)) >= 0:
        record = _record(item, at)
        if record is None:
            return None
        if record[0] == f"{prefix}byteorder" and bytes(item[record[1]:record[1] + 3]) == b"big":
            return None
        if record[0] == want:
            return SavedTensor(record[1], storage_bytes, rebuilt.dtype, rebuilt.storage_offset, rebuilt.size,
                               rebuilt.stride)
        at = record[1]
    return None
