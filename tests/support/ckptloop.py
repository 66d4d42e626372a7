"""A training loop that saves a checkpoint every step until it is killed: `python ckptloop.py URL FIRST`. Each
step's state is known from its number (every value of `w` is the step), so a test can check what it loads."""

from __future__ import annotations

import sys

import torch

from blobsync import TransferConfig
from blobsync.config import MiB
from blobsync.torch import Checkpoints


def state(step: int) -> dict[str, object]:
    return {"w": torch.full((1 << 20,), float(step)), "b": torch.arange(step, step + 5), "step": step}


if __name__ == "__main__":
    url, first = sys.argv[1], int(sys.argv[2])
    checkpoints = Checkpoints(url, keep=2, config=TransferConfig(block_size=MiB))
    step = first
    while True:
        checkpoints.save(step, state(step))
        print(step, flush=True)
        step += 1
