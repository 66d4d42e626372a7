"""A DCP checkpoint on Blob as one whole state dict in one process, whatever world size saved it: for inference,
export and evaluation; written, when asked, as one `torch.save` file or safetensors, locally or to a blob."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, cast

import torch

from blobsync.backends.registry import is_remote
from blobsync.client import Client
from blobsync.config import TransferConfig
from blobsync.errors import UsageError
from blobsync.torch.dcp import BlobStorageReader


def consolidate(url: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None, *,
                client: Client | None = None, config: TransferConfig | None = None, credential: object = None,
                weights_only: bool = True, rank: int | None = None) -> dict[str, Any]:
    """The whole state dict of the DCP checkpoint at the folder `url` (blobsync's, or DCP FileSystemWriter's
    uploaded), read in this process with no process group; with `dest` (a local path or a blob URL) also written
    as one `torch.save` file, or as safetensors where `dest` ends in `.safetensors` (flat names, `a.b.c`; values
    that are not tensors as JSON in its metadata; needs the safetensors package). `weights_only` as
    BlobStorageReader's. A checkpoint saved with `use_collectives=False` holds one state per rank: `rank` says
    whose."""
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    target = _destination(dest)
    reader = BlobStorageReader(url, client=client, config=config, credential=credential, weights_only=weights_only,
                               rank=rank)
    state: dict[str, Any] = {}
    try:
        if reader.per_rank and rank is None:
            raise UsageError(f"{reader.folder.display} was saved with use_collectives=False: each rank's state is its "
                             "own, none is the whole; pass rank=N for rank N's")
        # DCP's own way to a whole state (its dcp_to_torch_save): tensors made from the metadata, then loaded.
        _load_state_dict(state, storage_reader=reader, planner=_empty_planner(default_planner), no_dist=True)
    finally:
        reader.close()
    if target is not None:
        data = _safetensors(state, target) if target.lower().removesuffix("/").endswith(".safetensors") else None
        _write(target, state, data, config, credential)
    return state


def _empty_planner(module: Any) -> Any:
    """DCP's planner that makes each tensor of the checkpoint from its metadata (untyped in torch)."""
    return module._EmptyStateDictLoadPlanner()


def _destination(dest: str | os.PathLike[str] | None) -> str | None:
    if dest is None:
        return None
    text = os.fspath(dest) if isinstance(dest, str | os.PathLike) else dest
    if not isinstance(text, str) or not text or text.endswith(("/", os.sep)):
        raise UsageError(f"invalid dest={dest!r}: a file path or a blob URL to write the whole state to")
    return text


def _flat(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        out.update(_flat(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def _safetensors(state: dict[str, Any], dest: str) -> bytes:
    """The state as safetensors' bytes: each tensor named by its path (`model.layer.weight`); the other values
    (a step, param_groups) as JSON in the file's metadata, under the same names."""
    try:
        from safetensors.torch import save
    except ImportError:
        raise UsageError(f"{dest}: writing safetensors needs the safetensors package (pip install safetensors); "
                         "or give a dest that is not .safetensors for one torch.save file") from None
    flat = _flat(state)
    tensors = {k: v.contiguous() for k, v in flat.items() if isinstance(v, torch.Tensor)}
    values = {k: json.dumps(v, default=repr) for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return save(tensors, metadata=values or None)


def _write(dest: str, state: dict[str, Any], data: bytes | None, config: TransferConfig | None,
           credential: object) -> None:
    """`data` (or torch.save of `state`) at `dest`: a blob committed whole, or a local file renamed into place."""
    if is_remote(dest):
        base, sep, query = dest.partition("?")
        folder, name = base.rsplit("/", 1)
        with Client(folder + sep + query, config, credential=credential) as out:
            if data is not None:
                out.put(data, name)
                return
            with out.open(name, "wb") as blob:
                torch.save(state, cast(IO[bytes], blob))
        return
    path = Path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if data is not None:
                f.write(data)
            else:
                torch.save(state, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
