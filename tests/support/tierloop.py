"""Checkpoints with a local tier in a process of its own: `python tierloop.py URL LOCAL JOURNAL save STEP` writes
step STEP to the local tier and waits for its upload (a test kills it meanwhile); `... resume 0` only opens
Checkpoints on the same url and folder and closes it, which finishes the uploads a killed process owed. Each
step's state is known from its number."""

from __future__ import annotations

import sys

import torch

from blobsync import TransferConfig
from blobsync.config import MiB
from blobsync.torch import Checkpoints


def state(step: int) -> dict[str, object]:
    base = torch.randn(4 << 20, generator=torch.Generator().manual_seed(3))  # 16 MiB, frozen
    return {"base": base, "head": torch.full((1 << 16,), float(step)), "step": step}


if __name__ == "__main__":
    url, local, journal, mode, step = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    config = TransferConfig(block_size=MiB, journal_path=journal)
    with Checkpoints(url, keep=2, config=config, incremental=True, local_dir=local) as checkpoints:
        print("owed", len(checkpoints.resumed), flush=True)
        if mode == "save":
            checkpoints.save(step, state(step))
            print("written", step, flush=True)
    print("done", flush=True)
