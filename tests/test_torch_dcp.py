"""PyTorch Distributed Checkpoint on Blob (issue 40): dcp.save/load/async_save with BlobStorageWriter/Reader in a
real gloo process group of 2 and 4 spawned ranks, model and optimizer state sharded as DTensors over a CPU mesh,
saved by 4 and loaded by 2; a rank SIGKILLed mid-save leaves no .metadata. The bytes in storage are checked with
the SDK: every item's range of every rank's blob against the tensors the ranks held."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from conftest import Side
from support import ranks
from support.azurite import Azurite, free_port
from support.proxy import FaultProxy, Rule, hold

RANK = Path(__file__).resolve().parent / "support" / "torchrank.py"


def _group(args: dict[str, Any], world: int, tmp: Path, timeout: float = 240) -> list[dict[str, Any]]:
    """Run `world` ranks of support/torchrank.py to the end; each one's result."""
    return ranks.run(RANK, args, world, tmp, timeout)


def _expected(seed: int, width: int) -> dict[str, torch.Tensor]:
    """What the ranks held, whole: every tensor of the model's and the optimizer's state by its DCP key."""
    sys.path.insert(0, str(RANK.parent))
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torchrank import model_and_optimizer

    model, optimizer = model_and_optimizer(seed, width, None)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    flat = {f"model.{k}": v for k, v in model_sd.items()}
    for fqn, values in optim_sd["state"].items():
        flat.update({f"optim.state.{fqn}.{name}": v for name, v in values.items() if isinstance(v, torch.Tensor)})
    return flat


def _check_storage(side: Side, folder: str, seed: int, width: int) -> set[str]:
    """The checkpoint as the SDK reads it: each item's bytes in its rank's blob are the tensor chunk it names."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = pickle.loads(side.download(f"{folder}/.metadata"))
    blobs: dict[str, bytes] = {}
    want = _expected(seed, width)
    checked = set()
    for index, info in metadata.storage_data.items():
        data = blobs.setdefault(info.relative_path, side.download(f"{folder}/{info.relative_path}"))
        raw = data[info.offset:info.offset + info.length]
        md = metadata.state_dict_metadata[index.fqn]
        if not isinstance(md, TensorStorageMetadata):
            continue
        chunk = torch.load(io.BytesIO(raw), weights_only=True)  # DCP's own format: torch.save of the chunk
        assert chunk.dtype == md.properties.dtype
        whole = want[index.fqn]
        for dim, start in enumerate(index.offset):
            whole = whole.narrow(dim, start, chunk.shape[dim])
        assert torch.equal(chunk, whole), index
        checked.add(index.fqn)
    return checked


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_save_their_shards_and_load_them_back(world: int, source: Side, azurite: Azurite,
                                                     tmp_path: Path) -> None:
    url = source.url(azurite.base_url, "ckpt/step-1")
    assert _group({"mode": "save", "url": url, "seed": 3, "width": 256}, world, tmp_path) == [{"ok": True}] * world
    names = sorted(b.name for b in source.client.list_blobs(name_starts_with="ckpt/step-1/"))
    assert names == ["ckpt/step-1/.metadata", *(f"ckpt/step-1/__{r}_0.distcp" for r in range(world))]
    for name in names:  # each with a whole check: these small ones put at once, their MD5 checked by the service
        props = source.client.get_blob_client(name).get_blob_properties()
        assert props.content_settings.content_md5 is not None
    assert _check_storage(source, "ckpt/step-1", 3, 256) >= {"model.0.weight", "model.2.bias",
                                                              "optim.state.0.weight.exp_avg"}
    results = _group({"mode": "load", "url": url, "seed": 3, "width": 256}, world, tmp_path)
    assert all(r["ok"] for r in results), results


def test_saved_by_four_ranks_loaded_by_two_and_consolidated_in_one(source: Side, azurite: Azurite,
                                                                    tmp_path: Path) -> None:
    from blobsync.torch import consolidate

    url = source.url(azurite.base_url, "reshard/step-5")
    assert all(r["ok"] for r in _group({"mode": "save", "url": url, "seed": 5, "width": 512}, 4, tmp_path))
    results = _group({"mode": "load", "url": url, "seed": 5, "width": 512}, 2, tmp_path)
    assert all(r["ok"] for r in results), results
    # The whole state in this one process (no process group), written as one torch.save file, locally and to a
    # blob, and as safetensors: each read back by torch and the SDK, equal to what the 4 ranks held.
    want = _expected(5, 512)
    exported = source.url(azurite.base_url, "export/whole.pt")
    whole = consolidate(url, tmp_path / "whole.pt")
    consolidate(url, exported)
    consolidate(url, tmp_path / "whole.safetensors")
    from safetensors import safe_open
    from safetensors.torch import load_file

    from_blob = torch.load(io.BytesIO(source.download("export/whole.pt")), weights_only=True)
    for found in (whole, torch.load(tmp_path / "whole.pt", weights_only=True), from_blob):
        flat = {f"model.{k}": v for k, v in found["model"].items()}
        for fqn, values in found["optim"]["state"].items():
            flat.update({f"optim.state.{fqn}.{n}": v for n, v in values.items() if isinstance(v, torch.Tensor)})
        assert flat.keys() >= want.keys() and all(torch.equal(flat[k], v) for k, v in want.items())
    tensors = load_file(tmp_path / "whole.safetensors")
    assert all(torch.equal(tensors[k], v) for k, v in want.items())
    with safe_open(tmp_path / "whole.safetensors", "pt") as f:  # the values that are not tensors, as JSON
        assert json.loads(f.metadata()["extra.step"]) == whole["extra"]["step"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_ranks_saving_without_collectives_each_keep_their_own_state(source: Side, azurite: Azurite,
                                                                     tmp_path: Path) -> None:
    """`dcp.save(..., use_collectives=False)`: each rank plans alone, so each names its own blobs and metadata, as
    DCP's FileSystemWriter does; before, every rank wrote `__0_0.distcp` and `.metadata` over the others' and the
    load gave rank 1 rank 0's state, with no error."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from blobsync.errors import UsageError
    from blobsync.torch import BlobStorageWriter, consolidate
    from support.torchrank import rank_state

    url = source.url(azurite.base_url, "per-rank/step-1")
    assert _group({"mode": "rank-local", "url": url}, 2, tmp_path) == [{"ok": True}] * 2
    names = sorted(b.name.rsplit("/", 1)[1] for b in source.client.list_blobs(name_starts_with="per-rank/step-1/"))
    assert names == ["__0.metadata", "__0_0.distcp", "__1.metadata", "__1_0.distcp"]
    # Downloaded by the SDK, DCP's stock reader loads it (rank 0's, as it reads with no process group).
    for name in names:
        (tmp_path / name).write_bytes(source.download(f"per-rank/step-1/{name}"))
    stock = {"w": torch.zeros(4096), "extra": {"rank": -1}}
    dcp.load(stock, storage_reader=FileSystemReader(tmp_path), no_dist=True)
    assert torch.equal(stock["w"], rank_state(0)["w"]) and stock["extra"] == {"rank": 0}
    # One process: no state is the whole one, so consolidate asks whose; rank 1's is rank 1's.
    with pytest.raises(UsageError, match=r"use_collectives=False.*rank=N"):
        consolidate(url)
    one = consolidate(url, rank=1)
    assert torch.equal(one["w"], rank_state(1)["w"]) and one["extra"] == {"rank": 1}
    # A save with collectives into the folder leaves no rank's metadata a loader would fall back to.
    dcp.save({"w": torch.ones(8)}, storage_writer=BlobStorageWriter(url), no_dist=True)
    names = sorted(b.name.rsplit("/", 1)[1] for b in source.client.list_blobs(name_starts_with="per-rank/step-1/"))
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert torch.equal(consolidate(url)["w"], torch.ones(8))


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_async_save_returns_before_the_upload_and_resolves_once_committed(kind: str, source: Side, azurite: Azurite,
                                                                             tmp_path: Path) -> None:
    """DCP's async_save in a thread and in a background process, with its DefaultStager and plan caching."""
    url = source.url(azurite.base_url, "async/step-2")
    results = _group({"mode": "save", "url": url, "seed": 2, "width": 2048, "async": kind}, 2, tmp_path)
    assert [r["ok"] for r in results] == [True, True]
    assert not any(r["done_at_return"] for r in results)  # training went on while the upload ran
    assert _check_storage(source, "async/step-2", 2, 2048)
    assert all(r["ok"] for r in _group({"mode": "load", "url": url, "seed": 2, "width": 2048}, 2, tmp_path))


def test_a_rank_killed_mid_save_leaves_no_metadata_and_the_last_checkpoint_loads(
        source: Side, azurite: Azurite, proxy: FaultProxy, tmp_path: Path) -> None:
    ep = proxy.url
    first, second = source.url(ep, "kill/step-1"), source.url(ep, "kill/step-2")
    args = {"mode": "save", "seed": 1, "width": 8192, "block_mib": 1}
    assert all(r["ok"] for r in _group({**args, "url": first}, 2, tmp_path))
    proxy.add_rule(Rule("put_block", hold(), blob="kill/step-2/__1_", nth=3))
    out, port = tmp_path / "killed", free_port()
    procs = [ranks.start(RANK, {**args, "url": second, "seed": 2}, rank, 2, port, out) for rank in range(2)]
    try:
        proxy.wait_for_held(1, timeout=120)
        os.killpg(procs[1].pid, signal.SIGKILL)  # rank 1, half its blocks staged
        time.sleep(2)  # rank 0 goes on as far as it can: its own blob, then the wait for rank 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    proxy.clear_rules()
    proxy.release_holds()
    proxy.wait_idle()
    names = {b.name for b in source.client.list_blobs(name_starts_with="kill/step-2/")}
    assert "kill/step-2/.metadata" not in names and "kill/step-2/__1_0.distcp" not in names
    assert all(r["ok"] for r in _group({"mode": "load", "url": first, "seed": 1, "width": 8192}, 2, tmp_path))
    assert all(r["ok"] for r in _group({**args, "url": second, "seed": 2}, 2, tmp_path))  # saved again: whole
    assert all(r["ok"] for r in _group({"mode": "load", "url": second, "seed": 2, "width": 8192}, 2, tmp_path))


def test_a_folder_without_metadata_is_refused_with_one_line(source: Side, azurite: Azurite) -> None:
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageReader, IncompleteCheckpointError

    source.client.upload_blob("half/step-9/__0_0.distcp", b"x" * 100)
    with pytest.raises(IncompleteCheckpointError) as caught:
        dcp.load({"w": torch.zeros(3)}, storage_reader=BlobStorageReader(source.url(azurite.base_url,
                                                                                       "half/step-9")), no_dist=True)
    text = str(caught.value)
    assert "\n" not in text and "no complete checkpoint at" in text
    assert "half/step-9/: its .metadata is missing" in text
    assert source.sas.split("sig=")[1][:12] not in text
    assert isinstance(caught.value, FileNotFoundError)  # as a missing file is, to code that catches that


def test_one_process_saves_and_loads_plain_tensors_and_bytes(source: Side, azurite: Azurite) -> None:
    import torch.distributed.checkpoint as dcp

    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    url = source.url(azurite.base_url, "one/step-1")
    state = {"w": torch.randn(300, 7), "i": torch.arange(5), "h": torch.tensor(1.5, dtype=torch.bfloat16),
             "e": torch.zeros(0, 3), "blob": io.BytesIO(b"opaque"), "n": {"epoch": 4}}
    dcp.save(state, storage_writer=BlobStorageWriter(url), no_dist=True)
    back = {"w": torch.zeros(300, 7), "i": torch.zeros(5, dtype=torch.int64), "h": torch.tensor(0.0,
            dtype=torch.bfloat16), "e": torch.ones(0, 3), "blob": io.BytesIO(), "n": {"epoch": 0}}
    dcp.load(back, storage_reader=BlobStorageReader(url), no_dist=True)
    for key in ("w", "i", "h", "e"):
        assert torch.equal(back[key], state[key]), key
    assert back["n"] == {"epoch": 4}
    assert isinstance(back["w"], torch.Tensor) and not isinstance(back["w"], DTensor)
