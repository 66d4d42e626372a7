"""Checkpoints of one training run kept and found again: each save a folder (`step-00001230/`), a small pointer
(`latest`) written only once that folder is complete, older folders deleted beyond `keep` only after a newer one
is complete. Distributed state goes through DCP (every rank calls save and load); one process's through
torch.save. A process killed at any moment leaves `latest()` naming a complete checkpoint."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
from collections.abc import Callable
from typing import IO, Any, Literal, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save, save as dcp_save

from blobsync.client import Client
from blobsync.config import Overwrite, TransferConfig
from blobsync.errors import BlobNotFoundError, UsageError
from blobsync.redact import strip_query
from blobsync.torch._paths import below, container_path, folder_url
from blobsync.torch.dcp import METADATA, BlobStorageReader, BlobStorageWriter, IncompleteCheckpointError

POINTER = "latest"
STATE = "state.pt"  # a one-process checkpoint: torch.save's bytes, one blob
MARKERS = {METADATA: "dcp", STATE: "torch"}  # what makes a folder complete, by its format
_FOLDER = re.compile(r"^step-(\d{8,})/")
Format = Literal["auto", "dcp", "torch"]


def folder_of(step: int) -> str:
    return f"step-{step:08d}/"


class Checkpoints:
    """`Checkpoints(url, keep=3)` then `save(step, state)`, `latest()`, `load()`, `list()`. `url` is a folder URL
    (a SAS in it, or `credential`, or the environment's). `format`: 'dcp' (Distributed Checkpoint; the default
    where a process group is running), 'torch' (torch.save of the whole state; the default in one process)."""

    def __init__(self, url: str, keep: int = 3, *, client: Client | None = None, config: TransferConfig | None = None,
                 credential: object = None, format: Format = "auto") -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise UsageError(f"invalid keep={keep!r}: how many complete checkpoints to keep, 1 or more")
        if format not in ("auto", "dcp", "torch"):
            raise UsageError(f"invalid format={format!r}: 'auto', 'dcp' or 'torch'")
        self.url = folder_url(url)
        self.keep, self.format = keep, format
        self._own = client is None
        self.client = client if client is not None else Client(self.url, config, credential=credential)
        self._prefix = below(self.client, self.url)
        self._reading: set[int] = set()  # steps this object is loading: never pruned under it
        self._lock = threading.Lock()
        self._uploads: concurrent.futures.ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"Checkpoints({strip_query(self.url)!r}, keep={self.keep})"

    # --- saving -------------------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], async_: bool = False
             ) -> concurrent.futures.Future[int] | None:
        """Save `state` as checkpoint `step` (every rank calls it under a process group). With `async_`, return once
        the state is copied to host memory: the Future resolves (to `step`) when the checkpoint is complete and
        `latest` names it; without, return then."""
        step = _step(step)
        if self._format() == "dcp":
            writer = BlobStorageWriter(self._url(folder_of(step)), client=self.client)
            if not async_:
                dcp_save(state, storage_writer=writer, no_dist=not _distributed())
                self._complete(step, "dcp")
                return None
            return self._then(dcp_async_save(state, storage_writer=writer, no_dist=not _distributed()), step, "dcp")
        if not async_:
            self._write_torch(step, state)
            return None
        staged = to_host(state)  # the part training waits for: a copy it may go on changing beside
        if self._uploads is None:
            self._uploads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blobsync-checkpoints")
        return self._uploads.submit(self._write_torch, step, staged)

    def _write_torch(self, step: int, state: dict[str, Any]) -> int:
        with self.client.open(self._name(folder_of(step) + STATE), "wb") as out:  # one commit, at close
            torch.save(state, cast(IO[bytes], out))
        self._complete(step, "torch")
        return step

    def _then(self, future: Any, step: int, fmt: str) -> concurrent.futures.Future[int]:
        done: concurrent.futures.Future[int] = concurrent.futures.Future()

        def finished(saved: Any) -> None:
            try:
                saved.result()
                self._complete(step, fmt)
            except BaseException as exc:  # the caller learns why through the Future
                done.set_exception(exc)
            else:
                done.set_result(step)

        future.add_done_callback(finished)
        return done

    def _complete(self, step: int, fmt: str) -> None:
        """The folder is whole: the pointer names it (if it is the newest), then older ones go beyond `keep`."""
        if _distributed() and dist.get_rank() != 0:
            return
        with self._lock:
            newest = self.latest()
            if newest is None or step >= newest:
                pointer = json.dumps({"step": step, "format": fmt}).encode()
                self.client.put(pointer, self._name(POINTER), self._overwriting())
            self._prune()

    def _prune(self) -> None:
        complete = self._folders()
        kept = sorted(complete)[-self.keep:]
        newest = max(complete, default=-1)
        for step in sorted(self._all_steps()):
            if step in kept or step in self._reading or step > newest:
                continue  # kept, being read here, or a save still under way (another process's)
            self._delete(step, complete.get(step))

    def _delete(self, step: int, marker: str | None) -> None:
        folder = folder_of(step)
        if marker is not None:  # the marker first: a folder half deleted is never taken for a complete one
            self.client.delete(self._name(folder + marker))
        self.client.remove(self._url(folder), recursive=True)

    # --- finding ------------------------------------------------------------------------------------------

    def list(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first."""
        return sorted(self._folders())

    def latest(self) -> int | None:
        """The newest complete checkpoint's step (None: there is none): the pointer's, checked; else a listing's."""
        try:
            pointed = json.loads(self.client.get(self._name(POINTER)))
            step = _step(pointed["step"])
            marker = next(m for m, f in MARKERS.items() if f == pointed["format"])
            self.client.stat(self._name(folder_of(step) + marker))
        except (BlobNotFoundError, ValueError, KeyError, TypeError, StopIteration, UsageError):
            return max(self._folders(), default=None)
        return step

    def load(self, step: int | None = None, state: dict[str, Any] | None = None, *,
             weights_only: bool = True) -> Any:
        """Checkpoint `step` (None: the latest). A DCP checkpoint loads into `state` in place (every rank calls it,
        each with its own state dict of the shapes to fill) and returns it; a torch.save one returns what was
        saved (`weights_only`: torch.load's)."""
        found = self._find(step)
        self._reading.add(found)
        try:
            complete = self._folders()
            if complete.get(found) == METADATA:
                if state is None:
                    raise UsageError("a distributed checkpoint loads into a state dict: pass state= (shapes to fill)")
                reader = BlobStorageReader(self._url(folder_of(found)), client=self.client)
                dcp_load(state, storage_reader=reader, no_dist=not _distributed())
                return state
            with self.client.open(self._name(folder_of(found) + STATE)) as data:
                return torch.load(cast(IO[bytes], data), map_location="cpu", weights_only=weights_only)
        finally:
            self._reading.discard(found)

    def _find(self, step: int | None) -> int:
        if step is None:
            latest = self.latest()
            if latest is None:
                raise IncompleteCheckpointError(f"no complete checkpoint under {strip_query(self.url)}", status=404,
                                                code="BlobNotFound")
            return latest
        step = _step(step)
        if step not in self._folders():
            raise IncompleteCheckpointError(f"no complete checkpoint {folder_of(step)} under "
                                            f"{strip_query(self.url)}", status=404, code="BlobNotFound",
                                            hint=f"complete ones: {self.list() or 'none'}")
        return step

    def _folders(self) -> dict[int, str]:
        """Each complete checkpoint's step and the marker that makes it so."""
        found: dict[int, str] = {}
        for props in self.client.ls(self._prefix):
            rel = props.name[len(self._base_path()):]
            match = _FOLDER.match(rel)
            if match and rel[match.end():] in MARKERS:
                found.setdefault(int(match.group(1)), rel[match.end():])
        return found

    def _all_steps(self) -> set[int]:
        return {int(m.group(1)) for p in self.client.ls(self._prefix)
                if (m := _FOLDER.match(p.name[len(self._base_path()):]))}

    # --- names --------------------------------------------------------------------------------------------

    def _format(self) -> str:
        return ("dcp" if _distributed() else "torch") if self.format == "auto" else self.format

    def _base_path(self) -> str:
        return container_path(self.url)

    def _name(self, relative: str) -> str:
        return self._prefix + relative

    def _url(self, relative: str) -> str:
        return self.client.url_for(self._name(relative))

    def _overwriting(self) -> TransferConfig:
        from dataclasses import replace

        return replace(self.client.aio.config, overwrite=Overwrite.TRUE)

    def close(self) -> None:
        """Wait for the saves under way; close the Client made here."""
        if self._uploads is not None:
            self._uploads.shutdown(wait=True)
        if self._own:
            self.client.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UsageError(f"invalid step={step!r}: a whole number, 0 or more")
    return step


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def to_host(value: Any, copy: Callable[[torch.Tensor], torch.Tensor] = lambda t: t.detach().to("cpu", copy=True)
             ) -> Any:
    """A copy of `value` whose tensors are in host memory and owned by it (training may change the originals)."""
    if isinstance(value, torch.Tensor):
        return copy(value)
    if isinstance(value, dict):
        return {k: to_host(v, copy) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_host(v, copy) for v in value)
    return value
