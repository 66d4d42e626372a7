"""One rank of a real gloo process group, for the DCP tests: `python torchrank.py JSON` saves or loads a model and
optimizer state dict sharded as DTensors over a CPU mesh, through blobsync.torch, and writes what it found."""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor


def model_and_optimizer(seed: int, width: int, mesh: Any | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same model on every rank (seeded), its parameters sharded on dim 0 over `mesh` (None: whole), and an
    Adam that took one step with known gradients: its state is as sharded as the parameters."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 32))
    if mesh is not None:
        for module in model.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                module.register_parameter(name, nn.Parameter(distribute_tensor(param.data, mesh, [Shard(0)])))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    for i, param in enumerate(model.parameters()):
        param.grad = torch.full_like(param, float(seed % 7 + i + 1))
    optimizer.step()
    return model, optimizer


def _full(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: _full(v) for k, v in value.items()}
    return value


def _same(got: Any, want: Any, path: str = "") -> list[str]:
    if isinstance(want, dict):
        keys = sorted(set(got) | set(want), key=str)
        return [d for k in keys for d in _same(got.get(k), want.get(k), f"{path}/{k}")]
    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        return [] if ok else [path]
    return [] if got == want else [path]


def _async_saves(args: dict[str, Any], state: dict[str, Any], writer: Any) -> dict[str, Any]:
    """async_save as the fastest DCP setup runs it: a thread or a process (`args["async"]`), DCP's DefaultStager
    and plan caching, twice (the second save on the cached plan); returns whether either was done at return."""
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    kind = AsyncCheckpointerType.PROCESS if args["async"] == "process" else AsyncCheckpointerType.THREAD
    stager = DefaultStager(StagingOptions(False, False, False, False))  # CPU: no pinned memory, no CUDA streams
    planner = DefaultSavePlanner(enable_plan_caching=True)
    blocked = []
    try:
        for _ in range(2):
            response = dcp.async_save(state, storage_writer=writer, planner=planner, async_checkpointer_type=kind,
                                      async_stager=stager)
            future = getattr(response, "upload_completion", response)
            blocked.append(future.done())  # training would go on here
            future.result()
    finally:
        stager.close()
    return {"ok": True, "done_at_return": any(blocked)}


def lora_state(step: int, mesh: Any) -> dict[str, Any]:
    """A fine-tuning state: a frozen base sharded over the ranks (the same at every step) and an adapter, the
    same on every rank, that changes with the step."""
    from torch.distributed.tensor import Shard, distribute_tensor

    base = torch.randn(2048, 1024, generator=torch.Generator().manual_seed(7))  # 8 MiB, 4 MiB a rank
    adapter = torch.full((64, 1024), float(step))  # 256 KiB
    return {"base": distribute_tensor(base, mesh, [Shard(0)]), "adapter": adapter, "step": step}


def _tiered(args: dict[str, Any], config: Any, mesh: Any) -> dict[str, Any]:
    """Steps 1-3 through Checkpoints(incremental, local_dir or async): what each rank's saves sent, and step 3
    loaded back from Blob alone."""
    from blobsync.torch import Checkpoints

    saved = []
    with Checkpoints(args["url"], keep=2, config=config, incremental=True, local_dir=args.get("local")) as checkpoints:
        for step in (1, 2, 3):
            started = time.monotonic()
            pending = checkpoints.save(step, lora_state(step, mesh), async_=args.get("async", False))
            blocked = time.monotonic() - started
            done = pending.result(timeout=120) if hasattr(pending, "result") else pending
            saved.append({"step": done.step, "sent": done.bytes_sent, "copied": done.bytes_copied,
                          "base": done.base, "blocked": blocked})
    dist.barrier()
    state = lora_state(0, mesh)
    with Checkpoints(args["url"], keep=2, config=config) as blob_only:
        blob_only.load(3, state=state)
    want = lora_state(3, mesh)
    same = torch.equal(state["base"].full_tensor(), want["base"].full_tensor()) and \
        torch.equal(state["adapter"], want["adapter"]) and state["step"] == 3
    return {"ok": same, "saved": saved}


def rank_state(rank: int) -> dict[str, Any]:
    """What rank `rank` holds in a save without collectives: the same keys on every rank, its own values."""
    return {"w": torch.full((4096,), float(rank + 1)), "extra": {"rank": rank}}


def _rank_local(args: dict[str, Any], config: Any) -> dict[str, Any]:
    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    rank = args["rank"]
    dcp.save(rank_state(rank), storage_writer=BlobStorageWriter(args["url"], config=config), use_collectives=False)
    dist.barrier()  # every rank's part is there before any loads
    state = {"w": torch.zeros(4096), "extra": {"rank": -1}}
    dcp.load(state, storage_reader=BlobStorageReader(args["url"], config=config))
    want = rank_state(rank)
    return {"ok": torch.equal(state["w"], want["w"]) and state["extra"] == want["extra"]}


def main(args: dict[str, Any]) -> dict[str, Any]:
    from blobsync import TransferConfig
    from blobsync.config import MiB
    from blobsync.torch import BlobStorageReader, BlobStorageWriter

    rank, world = args["rank"], args["world"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args['port']}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.get("timeout", 120)))
    try:
        mesh = init_device_mesh("cpu", (world,))
        config = TransferConfig(block_size=args.get("block_mib", 4) * MiB)
        if args["mode"] == "ckpt-save":  # steps 1-3 through Checkpoints(keep=2): the last one is the seed's
            from blobsync.torch import Checkpoints

            with Checkpoints(args["url"], keep=2, config=config) as checkpoints:
                for step in (1, 2, 3):
                    model, optimizer = model_and_optimizer(args["seed"] + 3 - step, args["width"], mesh)
                    model_sd, optim_sd = get_state_dict(model, optimizer)
                    checkpoints.save(step, {"model": model_sd, "optim": optim_sd,
                                            "extra": {"step": args["seed"], "name": "run7"}})
            return {"ok": True}
        if args["mode"] == "ckpt-async-train":  # async saves while training runs collectives on the default group
            from blobsync.torch import Checkpoints

            w = torch.zeros(1 << 16)  # the same on every rank (replicated: DCP saves it once)
            saves = []
            with Checkpoints(args["url"], keep=2, config=config) as checkpoints:
                for step in range(args.get("steps", 40)):
                    grad = torch.ones(1 << 16)
                    dist.all_reduce(grad)  # training's own collective, beside the save's
                    w.add_(grad)
                    if step % 10 == 0:
                        saves.append(checkpoints.save(step, {"w": w}, async_=True))
                done = [f.result(timeout=120).step for f in saves]
                state = {"w": torch.zeros(1 << 16)}
                checkpoints.load(done[-1], state=state)  # rank 0 may not have moved `latest` yet
            return {"ok": done == list(range(0, args.get("steps", 40), 10)) and torch.equal(state["w"], w -
                    float(world) * (args.get("steps", 40) - 1 - done[-1]))}
        if args["mode"] == "ckpt-tiered":  # a LoRA-like run: a frozen sharded base, a small adapter trained
            return _tiered(args, config, mesh)
        if args["mode"] == "ckpt-tier-kill":  # step 1 to the local tier; the test kills the ranks during its upload
            from blobsync.torch import Checkpoints

            with Checkpoints(args["url"], keep=2, config=config, local_dir=args["local"]) as checkpoints:
                checkpoints.save(1, lora_state(1, mesh))
                print("written", flush=True)
            return {"ok": False}  # not reached: killed while uploading
        if args["mode"] == "ckpt-tier-resume":  # only open and close: the uploads the killed ranks owed finish
            from blobsync.torch import Checkpoints

            with Checkpoints(args["url"], keep=2, config=config, local_dir=args["local"]) as checkpoints:
                owed = [f.result(timeout=120).step for f in checkpoints.resumed]
            dist.barrier()
            state = lora_state(0, mesh)
            with Checkpoints(args["url"], keep=2, config=config) as blob_only:
                latest = blob_only.latest()
                blob_only.load(1, state=state)
            want = lora_state(1, mesh)
            same = torch.equal(state["base"].full_tensor(), want["base"].full_tensor()) and \
                torch.equal(state["adapter"], want["adapter"]) and state["step"] == 1
            return {"ok": same and latest == 1, "owed": owed}
        if args["mode"] == "rank-local":  # each rank saves and loads a state of its own, with no collectives
            return _rank_local(args, config)
        if args["mode"] == "save":
            model, optimizer = model_and_optimizer(args["seed"], args["width"], mesh)
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd, "extra": {"step": args["seed"], "name": "run7"}}
            writer = BlobStorageWriter(args["url"], config=config)
            if args.get("async"):
                return _async_saves(args, state, writer)
            dcp.save(state, storage_writer=writer)
            return {"ok": True}
        model, optimizer = model_and_optimizer(args["seed"] + 1000, args["width"], mesh)  # other values
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "extra": {"step": -1, "name": ""}}
        if args["mode"] == "ckpt-load":
            from blobsync.torch import Checkpoints

            with Checkpoints(args["url"], keep=2, config=config) as checkpoints:
                assert checkpoints.latest() == 3 and checkpoints.list() == [2, 3]
                checkpoints.load(state=state)
        else:
            dcp.load(state, storage_reader=BlobStorageReader(args["url"], config=config))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        want_model, want_optimizer = model_and_optimizer(args["seed"], args["width"], None)
        want_m, want_o = get_state_dict(want_model, want_optimizer)
        got_m, got_o = get_state_dict(model, optimizer)
        differs = _same(_full(got_m), want_m, "model") + _same(_full(got_o), want_o, "optim")
        differs += _same(state["extra"], {"step": args["seed"], "name": "run7"}, "extra")
        return {"ok": not differs, "differs": differs}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    from support.ranks import rank_main

    rank_main(main)
