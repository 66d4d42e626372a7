"""Lightning on Blob (issue 40): a 2-epoch CPU fit of a tiny model saving through BlobCheckpointIO (sync and async),
then a fit resumed from the checkpoint on Blob; no checkpoint file on the local disk, and the one on Blob read back
with the SDK."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import lightning  # pinned in the dev set-up beside torch: these tests run in CI
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import Side
from support.azurite import Azurite


class Tiny(lightning.LightningModule):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Counted(lightning.Callback):  # type: ignore[misc,name-defined]
    """How many training batches a fit ran."""

    def __init__(self) -> None:
        self.seen = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.seen += 1


def _data() -> DataLoader[tuple[torch.Tensor, ...]]:
    torch.manual_seed(1)
    x = torch.randn(64, 8)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)


def _trainer(tmp: Path, plugin: object, epochs: int) -> object:
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp / "ckpts", save_top_k=1, monitor=None, save_last=True)
    return lightning.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, plugins=[plugin],
                             callbacks=[checkpoint], logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp)


@pytest.mark.parametrize("async_", [False, True])
def test_a_fit_saves_to_blob_and_a_second_fit_resumes_from_it(async_: bool, source: Side, azurite: Azurite,
                                                              tmp_path: Path) -> None:
    from blobsync.torch.lightning import BlobCheckpointIO

    url = source.url(azurite.base_url, "lightning/run1")
    model = Tiny()
    trainer = _trainer(tmp_path, BlobCheckpointIO(url, root=tmp_path, async_=async_), 2)
    trainer.fit(model, _data())  # type: ignore[attr-defined]
    names = sorted(b.name for b in source.client.list_blobs(name_starts_with="lightning/run1/"))
    assert "lightning/run1/ckpts/last.ckpt" in names and len(names) == 2, names  # top-1 and last
    assert not list(tmp_path.rglob("*.ckpt"))  # nothing on the local disk
    saved = torch.load(io.BytesIO(source.download("lightning/run1/ckpts/last.ckpt")), weights_only=False)
    assert saved["epoch"] == 1 and torch.equal(saved["state_dict"]["layer.weight"], model.layer.weight.detach())

    resumed = Tiny()
    again = _trainer(tmp_path, BlobCheckpointIO(url, root=tmp_path, async_=async_), 3)
    again.fit(resumed, _data(), ckpt_path=str(tmp_path / "ckpts" / "last.ckpt"))  # type: ignore[attr-defined]
    assert again.current_epoch == 3  # type: ignore[attr-defined]
    after = torch.load(io.BytesIO(source.download("lightning/run1/ckpts/last.ckpt")), weights_only=False)
    assert after["epoch"] == 2 and after["global_step"] == 12  # 4 batches an epoch, 3 epochs in all


def test_a_missing_checkpoint_is_file_not_found(source: Side, azurite: Azurite, tmp_path: Path) -> None:
    from blobsync.torch.lightning import BlobCheckpointIO

    io_ = BlobCheckpointIO(source.url(azurite.base_url, "lightning/none"), root=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"checkpoint .* not found"):
        io_.load_checkpoint(tmp_path / "nothing.ckpt")


def test_a_dirpath_on_blob_resumes_last_and_versions_as_on_local_disk(source: Side, azurite: Azurite,
                                                                       azurite_env: str, tmp_path: Path) -> None:
    """ModelCheckpoint(dirpath='blobsync://container/...'): Lightning's own file checks see the blobs, so a
    second run into the folder writes `-v1` copies (as on local disk) and `ckpt_path="last"` resumes."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from blobsync.torch.lightning import BlobCheckpointIO

    dirpath = f"blobsync://{source.name}/lightning/run2/ckpts"

    def trainer(epochs: int) -> Any:
        checkpoint = ModelCheckpoint(dirpath=dirpath, save_top_k=1, monitor=None, save_last=True)
        return lightning.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                                 plugins=[BlobCheckpointIO(source.url(azurite.base_url, "lightning/run2"))],
                                 callbacks=[checkpoint], enable_progress_bar=False, enable_model_summary=False,
                                 default_root_dir=tmp_path)

    trainer(2).fit(Tiny(), _data())
    time.sleep(1.1)  # a blob's Last-Modified is in whole seconds: "last" is the newest by it
    trainer(2).fit(Tiny(), _data())  # a second run into the same folder: versions, never overwrites
    names = sorted(b.name.rsplit("/", 1)[1] for b in source.client.list_blobs(name_starts_with="lightning/run2/"))
    assert names == ["epoch=1-step=8-v1.ckpt", "epoch=1-step=8.ckpt", "last-v1.ckpt", "last.ckpt"], names
    resumed, batches = trainer(3), Counted()
    resumed.callbacks.append(batches)
    resumed.fit(Tiny(), _data(), ckpt_path="last")  # the preempted job's restart idiom
    assert resumed.current_epoch == 3 and resumed.global_step == 12
    assert batches.seen == 4  # one epoch run: it went on from epoch 2 (from scratch would be 12)
    after = torch.load(io.BytesIO(source.download("lightning/run2/ckpts/last-v1.ckpt")), weights_only=False)
    assert after["epoch"] == 2  # the newest last checkpoint (the second run's) went on, as Lightning does locally
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("path", ["blobsync://{c}/lightning/other/x.ckpt", "blobsync://{c}/lightning/run3/../x.ckpt",
                                  "blobsync://elsewhere/lightning/run3/x.ckpt"])
def test_a_blob_path_outside_the_folder_is_refused(path: str, source: Side, azurite: Azurite) -> None:
    from blobsync.errors import UsageError
    from blobsync.torch.lightning import BlobCheckpointIO

    io_ = BlobCheckpointIO(source.url(azurite.base_url, "lightning/run3"))
    with pytest.raises(UsageError, match="is not a checkpoint under this BlobCheckpointIO's folder"):
        io_.name(path.format(c=source.name))
    assert io_.name(f"blobsync://{source.name}/lightning/run3/ckpts/a.ckpt").endswith("ckpts/a.ckpt")
