"""Lightning's checkpoints on Blob: `Trainer(plugins=[BlobCheckpointIO(url)])`. The paths Lightning names (a
ModelCheckpoint's dirpath and file names) become blob names under `url`; each checkpoint is torch.save's bytes
staged into blocks and committed once (no local file), with async saving that returns once the state is in host
memory."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from pathlib import PurePath
from typing import IO, Any, cast

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from blobsync.client import Client
from blobsync.config import TransferConfig
from blobsync.errors import BlobNotFoundError, UsageError
from blobsync.fsspec import PROTOCOL
from blobsync.redact import strip_query
from blobsync.torch import _pending
from blobsync.torch._paths import below, container_path, folder_url
from blobsync.torch.checkpoints import to_host

REMOTE = f"{PROTOCOL}://"  # a ModelCheckpoint dirpath on Blob, through blobsync's fsspec filesystem


class BlobCheckpointIO(CheckpointIO):
    """Saves, loads and removes Lightning checkpoints as blobs under the folder URL `url` (a SAS in it, or
    `credential`, or the environment's). A path Lightning gives is named relative to `root` (default: the
    current folder; a path outside it keeps its last part). `async_=True` returns from a save once the state is
    copied to host memory; the upload finishes in the background, and teardown (the end of fit) waits for it."""

    def __init__(self, url: str, *, root: str | os.PathLike[str] | None = None, async_: bool = False,
                 client: Client | None = None, config: TransferConfig | None = None,
                 credential: object = None) -> None:
        super().__init__()
        self.url = folder_url(url)
        self.client = client if client is not None else Client(self.url, config, credential=credential)
        self._prefix = below(self.client, self.url)
        self.root = os.path.abspath(root if root is not None else os.getcwd())
        self.async_ = async_
        self._saving: dict[str, _pending.Save[None]] = {}
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        _keep_protocol()

    def name(self, path: str | os.PathLike[str]) -> str:
        """The blob name a Lightning path becomes (relative to the folder URL): a 'blobsync://container/...' path
        (a ModelCheckpoint dirpath on Blob) names its blob; a local one is taken relative to `root`."""
        text = os.fspath(path)
        if isinstance(text, str) and text.startswith(REMOTE):
            return self._prefix + self._below_folder(text)
        full = os.path.abspath(text)
        rel = os.path.relpath(full, self.root)
        if rel.startswith(os.pardir):
            rel = os.path.basename(full)
        return self._prefix + PurePath(rel).as_posix()

    def _below_folder(self, text: str) -> str:
        from blobsync.backends.registry import parse_location

        container, _, rest = text[len(REMOTE):].strip("/").partition("/")
        own = parse_location(strip_query(self.url))
        folder = container_path(self.url)
        if container != own.container or not rest.startswith(folder) or rest == folder.rstrip("/") or \
                any(part in (".", "..") for part in rest.split("/")):  # never a name that climbs out of the folder
            raise UsageError(f"{text!r} is not a checkpoint under this BlobCheckpointIO's folder "
                             f"{strip_query(self.url)}: give ModelCheckpoint a dirpath under it")
        return rest[len(folder):]

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        name = self.name(path)
        if not self.async_:
            self._write(name, checkpoint)
            return
        staged = to_host(checkpoint)  # training may change the originals from here on
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blobsync-lightning")
            what = f"checkpoint {strip_query(self.client.url_for(name))}"
            self._saving[name] = _pending.chain(self._pool.submit(self._write, name, staged), _pending.Save(what))

    def _write(self, name: str, checkpoint: dict[str, Any]) -> None:
        with self.client.open(name, "wb") as out:  # one commit, at close: never half a checkpoint
            torch.save(checkpoint, cast(IO[bytes], out))

    def load_checkpoint(self, path: str | os.PathLike[str], map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        name = self._settled(self.name(path))
        try:
            with self.client.open(name) as data:
                # Lightning's None is torch.load's default, True: a planted checkpoint's pickle runs no code
                # (weights_only=False is the caller's say, for a folder they trust as they trust their code).
                loaded = torch.load(cast(IO[bytes], data), map_location=map_location or "cpu",
                                    weights_only=True if weights_only is None else bool(weights_only))
        except BlobNotFoundError:
            raise FileNotFoundError(f"checkpoint {os.fspath(path)!r} not found at {self.client.url_for(name)}"
                                    .split("?")[0]) from None
        return cast(dict[str, Any], loaded)

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        self.client.delete(self._settled(self.name(path)))

    def _settled(self, name: str) -> str:
        """`name`, once a save of it under way has finished (its error raised here)."""
        with self._lock:
            saving = self._saving.pop(name, None)
        if saving is not None:
            saving.result()
        return name

    def teardown(self) -> None:
        """Wait for every save under way; the first error is raised."""
        with self._lock:
            saving, self._saving = list(self._saving.values()), {}
        for future in saving:
            future.result()


def _keep_protocol() -> None:
    """Lightning (2.6) drops the protocol from the `last` checkpoints ModelCheckpoint finds under a remote dirpath
    (Lightning-AI/pytorch-lightning#18261): its checkpoint connector then looks for them on the local disk, and
    `fit(ckpt_path="last")` trains from scratch. Under a `blobsync://` dirpath the names found keep the protocol;
    every other dirpath is left to Lightning."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    original = ModelCheckpoint._find_last_checkpoints
    if getattr(original, "blobsync", False):
        return

    def find(self: ModelCheckpoint, trainer: Any) -> set[str]:
        found: set[str] = original(self, trainer)
        if not str(self.dirpath or "").startswith(REMOTE):
            return found
        return {p if p.startswith(REMOTE) else REMOTE + PurePath(p).as_posix().lstrip("/") for p in found}

    find.blobsync = True  # type: ignore[attr-defined]
    ModelCheckpoint._find_last_checkpoints = find  # type: ignore[method-assign]
