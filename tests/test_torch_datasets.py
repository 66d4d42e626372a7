"""Datasets of blobs for DataLoader workers (issue 40): map-style with DistributedSampler and iterable split by rank
and worker, 2 ranks (a real gloo group) x 2 workers, under fork and under spawn: every item exactly once per epoch,
its bytes those the SDK wrote."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from conftest import Side
from support import ranks
from support.azurite import Azurite

DATA = Path(__file__).resolve().parent / "support" / "torchdata.py"


def _blobs(side: Side, prefix: str, count: int) -> list[str]:
    """`count` blobs of different sizes and random bytes under `prefix`; their digests."""
    digests = []
    for i in range(count):
        data = os.urandom(1000 + 997 * i)
        side.client.upload_blob(f"{prefix}/item-{i:03d}.bin", data)
        digests.append(hashlib.sha256(data).hexdigest())
    return digests


def _ranks(args: dict[str, object], tmp: Path, world: int = 2) -> list[list[str]]:
    return ranks.run(DATA, args, world, tmp)


@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_every_item_once_per_epoch_across_two_ranks_of_two_workers(kind: str, start: str, source: Side,
                                                                   azurite: Azurite, tmp_path: Path) -> None:
    digests = _blobs(source, "train", 40)
    args = {"kind": kind, "start": start, "workers": 2, "epochs": 2, "url": source.url(azurite.base_url, "train"),
            "read_ahead": 20_000}
    per_rank = _ranks(args, tmp_path)
    for epoch in range(2):
        got = [item.split(":", 1)[1] for items in per_rank for item in items if item.startswith(f"{epoch}:")]
        assert sorted(got) == sorted(digests), epoch  # all of them, none twice
        assert all(got_rank for got_rank in per_rank)  # both ranks took part
    first = [i for i in per_rank[0] if i.startswith("0:")]
    second = [i.replace("1:", "0:", 1) for i in per_rank[0] if i.startswith("1:")]
    assert first != second  # shuffled anew each epoch


def test_map_style_in_one_process(source: Side, azurite: Azurite) -> None:
    from blobsync.errors import UsageError
    from blobsync.torch import BlobDataset

    digests = _blobs(source, "one", 5)
    source.client.upload_blob("one-more/not-under.bin", b"x")
    dataset = BlobDataset(source.url(azurite.base_url, "one"))
    assert len(dataset) == 5 and dataset.names == [f"item-{i:03d}.bin" for i in range(5)]
    assert [hashlib.sha256(dataset[i]).hexdigest() for i in range(5)] == digests
    assert hashlib.sha256(dataset[-1]).hexdigest() == digests[-1]
    with pytest.raises(IndexError):
        dataset[5]
    with pytest.raises(UsageError, match="no blobs under"):
        BlobDataset(source.url(azurite.base_url, "nothing-here"))
