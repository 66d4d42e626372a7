"""A checkpoint's `.metadata` read with an unpickler that builds only what DCP metadata holds (its dataclasses,
torch sizes and dtypes, the storage records of DCP's and blobsync's writers, plain containers): a planted
`.metadata` cannot name a function to call, whatever the load's `weights_only`."""

from __future__ import annotations

import enum
import io
import pickle
from typing import Any

import torch

from blobsync.errors import IntegrityError

# module -> names it may give; "*types*" admits the module's own classes (dataclasses and enums, built by
# __new__ and a state dict: nothing of theirs runs on load).
_CLASSES_OF = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner")
_NAMES = {
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name, from a fixed table
    "torch": {"Size"},
    "blobsync.torch.dcp": {"BlobStorageInfo", "_Prefix"},
    "pathlib": {"PurePosixPath", "PosixPath", "PureWindowsPath", "PurePath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "bytearray", "complex", "slice"},
}


class _Refused(Exception):
    pass


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _CLASSES_OF and not name.startswith("__"):
            found = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(found, type) and found.__module__ == module and (
                    hasattr(found, "__dataclass_fields__") or issubclass(found, enum.Enum)):
                return found
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        elif name in _NAMES.get(module, ()):
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent id")


def load_metadata(data: bytes, where: str) -> Any:
    """The object pickled in `data` (a checkpoint's `.metadata` at `where`), or IntegrityError naming what a
    checkpoint's metadata never holds."""
    try:
        return _MetadataUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise IntegrityError(f"{where} names {exc}, which a checkpoint's metadata never holds: refused (loading it "
                             "could run code). Load checkpoints only from folders nobody else can write to") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            RecursionError, MemoryError) as exc:
        raise IntegrityError(f"{where} is not a checkpoint's metadata ({type(exc).__name__})") from None
