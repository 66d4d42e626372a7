"""One rank reading a dataset of blobs through a DataLoader with worker processes, for the dataset tests:
`python torchdata.py JSON` writes the digests of the items it got (in order)."""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(args: dict[str, Any]) -> list[str]:
    from blobsync.torch import BlobDataset, IterableBlobDataset

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args['port']}", rank=args["rank"],
                            world_size=args["world"], timeout=datetime.timedelta(seconds=120))
    try:
        got: list[str] = []
        for epoch in range(args.get("epochs", 1)):
            if args["kind"] == "map":
                dataset: Any = BlobDataset(args["url"], transform=digest)
                sampler = DistributedSampler(dataset, shuffle=True, seed=3)  # rank and world from the group
                sampler.set_epoch(epoch)
                loader = DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=args["workers"],
                                    multiprocessing_context=args["start"])
            else:
                dataset = IterableBlobDataset(args["url"], transform=digest, shuffle=True, seed=3,
                                              read_ahead_bytes=args.get("read_ahead"))
                dataset.set_epoch(epoch)
                loader = DataLoader(dataset, batch_size=None, num_workers=args["workers"],
                                    multiprocessing_context=args["start"])
            got += [f"{epoch}:{item}" for item in loader]
        return got
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    from support.ranks import rank_main

    rank_main(main)
