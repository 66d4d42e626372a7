"""Checkpoints of one training run kept and found again: each save a folder (`step-00001230/`), a small pointer
(`latest`) written only once that folder is complete, older folders deleted beyond `keep` only after a newer one
is complete. Distributed state goes through DCP (every rank calls save and load); one process's through
torch.save. A process killed at any moment leaves `latest()` naming a complete checkpoint."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save, save as dcp_save

from blobsync.client import Client
from blobsync.config import Overwrite, TransferConfig
from blobsync.errors import BlobNotFoundError, BlobsyncError, UsageError
from blobsync.redact import strip_query
from blobsync.torch import _pending
from blobsync.torch._paths import below, container_path, folder_url
from blobsync.torch.dcp import METADATA, BlobStorageReader, BlobStorageWriter, IncompleteCheckpointError

POINTER = "latest"
POINTER_MAX = 256  # bytes: blobsync's pointer is ~30; a larger (or deeper) one is not blobsync's, and is ignored
STATE = "state.pt"  # a one-process checkpoint: torch.save's bytes, one blob
MARKERS = {METADATA: "dcp", STATE: "torch"}  # what makes a folder complete, by its format
MAX_STEP = 10**10 - 1  # at most 10 digits: a name outside the range is never taken for a step
_FOLDER = re.compile(r"^step-([0-9]{8,10})/", re.ASCII)
Format = Literal["auto", "dcp", "torch"]


def folder_of(step: int) -> str:
    return f"step-{step:08d}/"


def step_of(relative: str) -> int | None:
    """The step a name below the run's folder belongs to, if it is in blobsync's one spelling (`step-00000400/`):
    ASCII digits, eight at least, no extra leading zero, at most MAX_STEP."""
    match = _FOLDER.match(relative)
    if match is None:
        return None
    step = int(match.group(1))
    return step if match.group(0) == folder_of(step) else None


class Checkpoints:
    """`Checkpoints(url, keep=3)` then `save(step, state)`, `latest()`, `load()`, `list()`. `url` is a folder URL
    (a SAS in it, or `credential`, or the environment's). `format`: 'dcp' (Distributed Checkpoint; the default
    where a process group is running), 'torch' (torch.save of the whole state; the default in one process).
    `process_group`: the group async DCP saves run their collectives on (default: a gloo group made for them)."""

    def __init__(self, url: str, keep: int = 3, *, client: Client | None = None, config: TransferConfig | None = None,
                 credential: object = None, format: Format = "auto", process_group: Any = None) -> None:
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
        self._group = process_group  # async DCP saves' collectives: apart from training's (made on first use)
        self._last: concurrent.futures.Future[int] | None = None  # the async DCP save under way
        self._stager: Any = None  # DCP's stager and caching planner of async saves (made on the first)
        self._planner: Any = None

    def __repr__(self) -> str:
        return f"Checkpoints({strip_query(self.url)!r}, keep={self.keep})"

    # --- saving -------------------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], async_: bool = False
             ) -> concurrent.futures.Future[int] | None:
        """Save `state` as checkpoint `step` (every rank calls it under a process group). With `async_`, return once
        the state is copied to host memory: the Future resolves (to `step`) when the checkpoint is complete and
        `latest` names it; without, return then. A step older than the newest complete checkpoint here is refused
        (`keep` would discard it at once): resume from that one, or save to another folder."""
        step = _step(step)
        self._check_newer(step)
        what = f"checkpoint {folder_of(step)} under {strip_query(self.url)}"
        if self._format() == "dcp":
            writer = BlobStorageWriter(self._url(folder_of(step)), client=self.client)
            if not async_:
                dcp_save(state, storage_writer=writer, no_dist=not _distributed())
                self._complete(step, "dcp")
                return None
            if self._last is not None:  # one at a time: two saves' collectives on one group would interleave
                concurrent.futures.wait([self._last])
            stager, planner = self._async_parts()
            started = dcp_async_save(state, storage_writer=writer, no_dist=not _distributed(),
                                     process_group=self._async_group(), async_stager=stager, planner=planner,
                                     async_checkpointer_type=_checkpointer())
            uploaded = getattr(started, "upload_completion", started)  # an AsyncSaveResponse where staging is async
            self._last = _pending.chain(cast(concurrent.futures.Future[Any], uploaded), _pending.Save(what),
                                        lambda _: self._complete(step, "dcp"))
            return self._last
        if not async_:
            self._write_torch(step, state)
            return None
        staged = to_host(state)  # the part training waits for: a copy it may go on changing beside
        if self._uploads is None:
            self._uploads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blobsync-checkpoints")
        return _pending.chain(self._uploads.submit(self._write_torch, step, staged), _pending.Save(what))

    def _check_newer(self, step: int) -> None:
        newest = self.latest()
        if newest is not None and step < newest:
            raise UsageError(f"step {step} is older than the newest complete checkpoint under "
                             f"{strip_query(self.url)} (step {newest}): keep={self.keep} would delete it once saved. "
                             "Resume from that one (load()), or save this run to another folder")

    def _async_parts(self) -> tuple[Any, Any]:
        """DCP's fastest async set-up, made once and kept for every save: its DefaultStager (on a GPU host, pinned
        host memory and the copy off the GPU overlapped with training) and a planner that caches the plan (the
        same state's plan is not gathered again)."""
        if self._stager is None:
            from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                        use_async_staging=cuda, use_non_blocking_copy=cuda))
            self._planner = DefaultSavePlanner(enable_plan_caching=True)
        return self._stager, self._planner

    def _async_group(self) -> Any:
        """The process group of async DCP saves: one of their own (gloo), so that their collectives, run in the
        background, never interleave with training's on the default group."""
        if not _distributed():
            return None
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _write_torch(self, step: int, state: dict[str, Any]) -> int:
        with self.client.open(self._name(folder_of(step) + STATE), "wb") as out:  # one commit, at close
            torch.save(state, cast(IO[bytes], out))
        return self._complete(step, "torch")

    def _complete(self, step: int, fmt: str) -> int:
        """The folder is whole: the pointer names it (if it is the newest), then older ones go beyond `keep`
        (never `step` itself: a save that returned is there)."""
        if _distributed() and dist.get_rank() != 0:
            return step
        with self._lock:
            newest = self.latest()
            if newest is None or step >= newest:
                pointer = json.dumps({"step": step, "format": fmt}).encode()
                self.client.put(pointer, self._name(POINTER), self._overwriting())
            self._prune(step)
        return step

    def _prune(self, saved: int) -> None:
        complete = self._folders()
        kept = sorted(complete)[-self.keep:]
        newest = max(complete, default=-1)
        for step in sorted(self._all_steps()):
            if step in kept or step == saved or step in self._reading or step > newest:
                continue  # kept, just saved, being read here, or a save still under way (another process's)
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
            step, fmt = _pointed(self.client.read_ranges([(self._name(POINTER), 0, POINTER_MAX + 1)])[0])
            marker = next(m for m, f in MARKERS.items() if f == fmt)
            self.client.stat(self._name(folder_of(step) + marker))
        except (BlobNotFoundError, ValueError, StopIteration):
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
                with _unwrapped():
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
            step = step_of(rel)
            if step is not None and rel[len(folder_of(step)):] in MARKERS:
                found.setdefault(step, rel[len(folder_of(step)):])
        return found

    def _all_steps(self) -> set[int]:
        return {step for p in self.client.ls(self._prefix)
                if (step := step_of(p.name[len(self._base_path()):])) is not None}

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
        if self._last is not None:  # an async DCP save: its upload and pointer need the Client still open
            concurrent.futures.wait([self._last])
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._own:
            self.client.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _checkpointer() -> Any:
    """Where an async DCP save uploads: under a process group, DCP's background process (it left a pure-Python
    training loop 72-75% of its speed where a background thread left 57-67%, the blocked time the same:
    bench/RESULTS.md, issue 48); in one process, a thread."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    return AsyncCheckpointerType.PROCESS if _distributed() else AsyncCheckpointerType.THREAD


def _step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise UsageError(f"invalid step={step!r}: a whole number from 0 to {MAX_STEP}")
    return step


def _pointed(data: object) -> tuple[int, str]:
    """The step and format the pointer names; ValueError for anything not blobsync's small JSON object."""
    if isinstance(data, BlobNotFoundError):
        raise data
    if not isinstance(data, bytes) or len(data) > POINTER_MAX:  # bounded: its depth cannot reach the parser's
        raise ValueError("not a pointer")
    try:
        pointed = json.loads(data)
        step, fmt = pointed["step"], pointed["format"]
        return _step(step), str(fmt)
    except (ValueError, KeyError, TypeError, UsageError, RecursionError) as exc:
        raise ValueError("not a pointer") from exc


@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    """DCP's CheckpointException (every rank's traceback in its text) as the blobsync error behind it: one line."""
    try:
        yield
    except CheckpointException as exc:
        errors = [failure[0] if isinstance(failure, tuple) else failure for failure in exc.failures.values()]
        mine = next((e for e in errors if isinstance(e, BlobsyncError)), None)
        if mine is None:
            raise
        raise mine from None


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
