"""Checkpoints of one training run kept and found again: each save a folder (`step-00001230/`), a small pointer
(`latest`) written only once that folder is complete, older folders deleted beyond `keep` only after a newer one
is complete. Distributed state goes through DCP (every rank calls save and load); one process's through
torch.save. A process killed at any moment leaves `latest()` naming a complete checkpoint."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Literal, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save, save as dcp_save

from blobsync.blobfile import BlobWriter
from blobsync.client import Client
from blobsync.config import Overwrite, TransferConfig
from blobsync.engine.prior import SUFFIX as BLOCKS_SUFFIX
from blobsync.errors import BlobNotFoundError, BlobsyncError, IntegrityError, UsageError
from blobsync.filters import Filters
from blobsync.redact import strip_query
from blobsync.report import FileResult
from blobsync.torch import _pending
from blobsync.torch._lend import Lender, tensors_in
from blobsync.torch._paths import below, container_path, folder_url
from blobsync.torch._tier import LocalTier
from blobsync.torch._unpickle import load_metadata
from blobsync.torch.dcp import METADATA, BlobStorageReader, BlobStorageWriter, IncompleteCheckpointError

POINTER = "latest"
POINTER_MAX = 256  # bytes: blobsync's pointer is ~30; a larger (or deeper) one is not blobsync's, and is ignored
STATE = "state.pt"  # a one-process checkpoint: torch.save's bytes, one blob
MARKERS = {METADATA: "dcp", STATE: "torch"}  # what makes a folder complete, by its format
_MARKER = {fmt: marker for marker, fmt in MARKERS.items()}
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


@dataclass(frozen=True)
class Saved:
    """What one save did, on this rank (its own blobs): bytes in its blobs, sent over the link, and staged by the
    service from the earlier checkpoint `base` (an incremental save; None: none compared with). `notes` say why
    blobs were sent whole. The byte counts are None where DCP's background process wrote the blobs."""

    step: int
    bytes: int | None = None
    bytes_sent: int | None = None
    bytes_copied: int | None = None
    base: int | None = None
    notes: tuple[str, ...] = ()
    local: Path | None = None  # the local tier's copy of the step

    @classmethod
    def of(cls, step: int, results: Sequence[FileResult], base: int | None, local: Path | None = None) -> Saved:
        if not results:
            return cls(step, base=base, local=local)
        return cls(step, sum(r.size for r in results), sum(r.bytes_sent for r in results),
                   sum(r.bytes_copied for r in results), base,
                   tuple(note for r in results for note in r.reason.split("; ") if "sent whole" in note), local)


class Checkpoints:
    """`Checkpoints(url, keep=3)` then `save(step, state)`, `latest()`, `load()`, `list()`. `url` is a folder URL
    (a SAS in it, or `credential`, or the environment's). `format`: 'dcp' (Distributed Checkpoint; the default
    where a process group is running), 'torch' (torch.save of the whole state; the default in one process).
    `process_group`: the group async DCP saves run their collectives on (default: a gloo group made for them).
    `incremental=True`: each save sends only the blocks that changed since the newest complete checkpoint (the
    service stages the others from it); every checkpoint stays whole. `local_dir`: each save is written there
    first and uploaded in the background (resumed by the next Checkpoints on the same url and folder if this
    process dies first)."""

    def __init__(self, url: str, keep: int = 3, *, client: Client | None = None, config: TransferConfig | None = None,
                 credential: object = None, format: Format = "auto", process_group: Any = None,
                 incremental: bool = False, local_dir: str | os.PathLike[str] | None = None) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise UsageError(f"invalid keep={keep!r}: how many complete checkpoints to keep, 1 or more")
        if format not in ("auto", "dcp", "torch"):
            raise UsageError(f"invalid format={format!r}: 'auto', 'dcp' or 'torch'")
        if not isinstance(incremental, bool):
            raise UsageError(f"invalid incremental={incremental!r}: True or False")
        self.url = folder_url(url)
        self.keep, self.format, self.incremental = keep, format, incremental
        self.local = LocalTier(local_dir, _rank()) if local_dir is not None else None
        self._own = client is None
        self.client = client if client is not None else Client(self.url, config, credential=credential)
        self._prefix = below(self.client, self.url)
        self._reading: set[int] = set()  # steps this object is loading: never pruned under it
        self._lock = threading.Lock()
        self._uploads: concurrent.futures.ThreadPoolExecutor | None = None
        self._group = process_group  # async DCP saves' collectives: apart from training's (made on first use)
        self._last: concurrent.futures.Future[Any] | None = None  # the async DCP save under way
        self._stager: Any = None  # DCP's stager and caching planner of async saves (made on the first)
        self._planner: Any = None
        self._owed: dict[int, concurrent.futures.Future[Saved]] = self._resume_owed()
        self.resumed = list(self._owed.values())  # the uploads a process that died owed, finishing here

    def __repr__(self) -> str:
        return f"Checkpoints({strip_query(self.url)!r}, keep={self.keep})"

    # --- saving -------------------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], async_: bool = False
             ) -> Saved | concurrent.futures.Future[Saved]:
        """Save `state` as checkpoint `step` (every rank calls it under a process group) and say what was sent
        (`Saved`). With `async_`, return once the state is copied to host memory: the Future resolves when the
        checkpoint is complete and `latest` names it. With `local_dir`, return once the step is written there:
        the Future resolves when its upload is complete. A step older than the newest complete checkpoint here is
        refused (`keep` would discard it at once): resume from that one, or save to another folder."""
        step = _step(step)
        newest = self._check_newer(step)
        fmt = self._format()
        if self.local is not None:
            return self._save_tiered(step, state, fmt, async_)
        base = self._base(newest, fmt)
        if fmt == "dcp":
            return self._save_dcp(step, state, async_, base)
        if not async_:
            return self._write_torch(step, state, base)
        return self._background(self._write_torch, step, to_host(state), base)  # to_host: what training waits for

    def _check_newer(self, step: int) -> int | None:
        newest = self.latest()
        if newest is not None and step < newest:
            raise UsageError(f"step {step} is older than the newest complete checkpoint under "
                             f"{strip_query(self.url)} (step {newest}): keep={self.keep} would delete it once saved. "
                             "Resume from that one (load()), or save this run to another folder")
        return newest

    def _base(self, newest: int | None, fmt: str) -> int | None:
        """The checkpoint an incremental save compares with: the newest complete one, if in the same format."""
        if not self.incremental or newest is None:
            return None
        return newest if self._folders().get(newest) == _MARKER[fmt] else None

    def _background(self, work: Callable[..., Saved], *args: Any) -> concurrent.futures.Future[Saved]:
        """`work(*args)` on this object's one upload thread (saves land in order), as a tracked save."""
        if self._uploads is None:
            self._uploads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blobsync-checkpoints")
        what = f"checkpoint {folder_of(args[0])} under {strip_query(self.url)}"
        return _pending.chain(self._uploads.submit(work, *args), _pending.Save(what))

    def _save_dcp(self, step: int, state: dict[str, Any], async_: bool, base: int | None
                  ) -> Saved | concurrent.futures.Future[Saved]:
        writer = BlobStorageWriter(self._url(folder_of(step)), client=self.client, incremental=self.incremental,
                                   base=self._url(folder_of(base)) if base is not None else None)
        if not async_:
            dcp_save(state, storage_writer=writer, no_dist=not _distributed())
            self._complete(step, "dcp")
            return Saved.of(step, writer.written, base)
        if self._last is not None:  # one at a time: two saves' collectives on one group would interleave
            concurrent.futures.wait([self._last])
        stager, planner = self._async_parts()
        started = dcp_async_save(state, storage_writer=writer, no_dist=not _distributed(),
                                 process_group=self._async_group(), async_stager=stager, planner=planner,
                                 async_checkpointer_type=_checkpointer())
        uploaded = getattr(started, "upload_completion", started)  # an AsyncSaveResponse where staging is async

        def completed(_: object) -> Saved:
            self._complete(step, "dcp")
            return Saved.of(step, writer.written, base)  # empty where DCP's process wrote them: counts unknown

        what = f"checkpoint {folder_of(step)} under {strip_query(self.url)}"
        self._last = _pending.chain(cast(concurrent.futures.Future[Any], uploaded), _pending.Save(what), completed)
        return self._last

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

    def _incremental(self, blocks_from: str | None, **more: Any) -> TransferConfig:
        """The Client's config for an upload of a step: overwriting, and for an incremental save, its block digests
        kept and its blocks compared with `blocks_from` (a name in the container)."""
        return replace(self.client.aio.config, overwrite=Overwrite.TRUE, block_digests=self.incremental,
                       blocks_from=blocks_from if self.incremental else None, **more)

    def _write_torch(self, step: int, state: dict[str, Any], base: int | None) -> Saved:
        config = self._incremental(self._base_path() + folder_of(base) + STATE if base is not None else None)
        out = self.client.open(self._name(folder_of(step) + STATE), "wb", config=config)
        assert isinstance(out, BlobWriter)
        lender = Lender(out)
        lender.offer(tensors_in(state))  # the state's CPU tensors go up from their own memory: it waits for this
        with out:  # one commit, at close
            torch.save(state, cast(IO[bytes], lender))
        self._complete(step, "torch")
        return Saved.of(step, [out.result] if out.result is not None else [], base)

    # --- the local tier -----------------------------------------------------------------------------------

    def _save_tiered(self, step: int, state: dict[str, Any], fmt: str, async_: bool
                     ) -> concurrent.futures.Future[Saved]:
        """The step written to the local tier (what training waits for; with `async_`, in one process, only the
        copy to host memory), then uploaded in the background. A local write that fails (a full disk) falls back
        to saving straight to Blob, with a warning."""
        if step in self._owed:  # the same step saved again: its earlier files are being uploaded
            concurrent.futures.wait([self._owed.pop(step)])
        if async_ and fmt == "torch":
            return self._background(self._tiered_work, step, to_host(state), fmt)
        try:
            self._write_local(step, state, fmt)
        except (OSError, RuntimeError, CheckpointException) as exc:
            self._fall_back(step, exc)
            return self._direct(step, state, fmt)
        return self._background(self._upload_step, step, fmt)

    def _tiered_work(self, step: int, state: dict[str, Any], fmt: str) -> Saved:
        try:
            self._write_local(step, state, fmt)
        except (OSError, RuntimeError) as exc:
            self._fall_back(step, exc)
            return self._write_torch(step, state, self._base(self.latest(), fmt))
        return self._upload_step(step, fmt)

    def _fall_back(self, step: int, exc: BaseException) -> None:
        """A local write the disk refused (full, over quota, too large) is said, and the step saved to Blob;
        any other failure is raised."""
        assert self.local is not None
        refused = _os_error(exc)
        if refused is None:
            raise exc
        self.local.discard(folder_of(step))
        warnings.warn(f"blobsync: checkpoint {folder_of(step)} could not be written under local_dir "
                      f"{str(self.local.root)!r} ({refused.strerror or refused}): saved straight to Blob instead",
                      RuntimeWarning, stacklevel=4)

    def _direct(self, step: int, state: dict[str, Any], fmt: str) -> concurrent.futures.Future[Saved]:
        done: concurrent.futures.Future[Saved] = concurrent.futures.Future()
        base = self._base(self.latest(), fmt)
        saved = self._save_dcp(step, state, False, base) if fmt == "dcp" else self._write_torch(step, state, base)
        done.set_result(cast(Saved, saved))
        return done

    def _write_local(self, step: int, state: dict[str, Any], fmt: str) -> None:
        assert self.local is not None
        name = folder_of(step)
        if fmt == "torch":
            folder = self.local.fresh(name)
            tmp = folder / (STATE + ".tmp")
            with open(tmp, "wb") as out:  # a Python file: a refused write's OSError stays behind torch's error
                torch.save(state, out)
            tmp.replace(folder / STATE)
        else:  # ranks on one host share the folder: each writes its own files, the coordinator .metadata
            from torch.distributed.checkpoint.filesystem import FileSystemWriter

            self.local.discard_state(name)
            self.local.folder(name).mkdir(parents=True, exist_ok=True)
            dcp_save(state, storage_writer=FileSystemWriter(self.local.folder(name)), no_dist=not _distributed())
        self.local.written(name)

    def _upload_step(self, step: int, fmt: str) -> Saved:
        """The step's local files of this rank uploaded through the engine (journaled: a process killed meanwhile
        has the next one finish it), the marker last; then the pointer and pruning, as for any save."""
        assert self.local is not None
        name, local = folder_of(step), self.local.folder(folder_of(step))
        if step in self._folders() and self._local_copy(step) is not None:  # done, all but saying so (a kill)
            self.local.uploaded(name, {})
            self._complete(step, fmt)
            return Saved(step, local=local)
        base = self._base(self._newest_before(step), fmt)
        from_ = self._base_path() + folder_of(base) if base is not None else None
        if fmt == "torch":
            report = self.client.copy(local / STATE, self._url(name + STATE),
                                      self._incremental(from_ + STATE if from_ else None), raise_on_error=True)
            landed: dict[str, str | None] = {STATE: report.written[0].etag if report.written else None}
        else:
            report = self.client.copy(local, self._url(name), self._incremental(from_, recursive=True),
                                      filters=Filters.parse(include_pattern=f"__{_rank()}_*"), as_subdir=False,
                                      raise_on_error=True)
            landed = {r.rel: r.etag for r in report.written}
            if _rank() == 0:
                wait_for_ranks(self.client, self._name(name), local / METADATA)
                marker = self.client.copy(local / METADATA, self._url(name + METADATA), self._incremental(None),
                                          raise_on_error=True)
                landed[METADATA] = marker.written[0].etag if marker.written else None
        self.local.uploaded(name, landed)
        self._complete(step, fmt)
        return Saved.of(step, report.written, base, local)

    def _newest_before(self, step: int) -> int | None:
        return max((s for s in self._folders() if s < step), default=None)

    def _resume_owed(self) -> dict[int, concurrent.futures.Future[Saved]]:
        """Uploads a process killed before they finished (its local files whole, their upload owed): finished now,
        in the background, in order; `close()` waits for them."""
        if self.local is None:
            return {}
        owed = {}
        for name in self.local.owed():
            step = step_of(name)
            if step is not None:
                fmt = "torch" if (self.local.folder(name) / STATE).exists() else "dcp"
                owed[step] = self._background(self._upload_step, step, fmt)
        return owed

    # --- completing and pruning ----------------------------------------------------------------------------

    def _complete(self, step: int, fmt: str) -> None:
        """The folder is whole: the pointer names it (if it is the newest), then older ones go beyond `keep`
        (never `step` itself: a save that returned is there), on Blob by the coordinator, locally by every rank."""
        if _distributed() and dist.get_rank() != 0:
            self._prune_local(step)
            return
        with self._lock:
            newest = self.latest()
            if newest is None or step >= newest:
                pointer = json.dumps({"step": step, "format": fmt}).encode()
                self.client.put(pointer, self._name(POINTER), self._overwriting())
            self._prune(step)
        self._prune_local(step)

    def _prune(self, saved: int) -> None:
        complete = self._folders()
        kept = sorted(complete)[-self.keep:]
        newest = max(complete, default=-1)
        for step in sorted(self._all_steps()):
            if step in kept or step == saved or step in self._reading or step > newest:
                continue  # kept, just saved, being read here, or a save still under way (another process's)
            self._delete(step, complete.get(step))

    def _prune_local(self, saved: int) -> None:
        """The local tier keeps what Blob keeps: a step older than the newest complete one and not kept goes (its
        upload is done: each rank uploads in order)."""
        if self.local is None:
            return
        complete = self._folders()
        kept = set(sorted(complete)[-self.keep:])
        newest = max(complete, default=-1)
        for name in self.local.steps():
            step = step_of(name)
            if step is not None and step < newest and step not in kept and step != saved \
                    and step not in self._reading:
                self.local.discard(name)

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
            local = self._local_copy(found)
            if complete.get(found) == METADATA:
                if state is None:
                    raise UsageError("a distributed checkpoint loads into a state dict: pass state= (shapes to fill)")
                reader = _local_reader(local) if local is not None else \
                    BlobStorageReader(self._url(folder_of(found)), client=self.client)
                with _unwrapped():
                    dcp_load(state, storage_reader=reader, no_dist=not _distributed())
                return state
            if local is not None:
                return torch.load(local / STATE, map_location="cpu", weights_only=weights_only)
            with self.client.open(self._name(folder_of(found) + STATE)) as data:
                return torch.load(cast(IO[bytes], data), map_location="cpu", weights_only=weights_only)
        finally:
            self._reading.discard(found)

    def _local_copy(self, step: int) -> Path | None:
        """The local tier's folder of `step` when it holds the same checkpoint as Blob: every blob of the folder
        there (its block records aside) a local file uploaded from here as that version (its size, mtime and the
        blob's ETag, as the upload recorded them), or else of the same size and MD5."""
        name = folder_of(step)
        if self.local is None or not self.local.whole(name):
            return None
        base = self._base_path() + name
        for props in self.client.ls(self._name(name)):
            relative = props.name[len(base):]
            if relative.endswith(BLOCKS_SUFFIX):
                continue
            same = self.local.same(name, relative, props.size, props.etag)
            if same is None:  # not recorded here (uploaded by a process that died before saying so): hashed
                same = props.content_md5 is not None and self.local.md5(name, relative) == (props.size,
                                                                                             props.content_md5)
            if not same:
                return None
        return self.local.folder(name)

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
        return replace(self.client.aio.config, overwrite=Overwrite.TRUE)

    def close(self) -> None:
        """Wait for the saves and uploads under way (those resumed from a process that died too); close the
        Client made here."""
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


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind a failed local write: itself, what torch.save's writer wrapped (a RuntimeError whose
    context is the file's error), or one rank's in DCP's CheckpointException."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError):
            return exc
        if isinstance(exc, CheckpointException):
            errors = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
            return next((e for e in map(_os_error, errors) if e is not None), None)
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _local_reader(folder: Path) -> Any:
    """DCP's reader of the local tier's copy of a checkpoint (the same bytes as on Blob, which this job wrote), its
    `.metadata` first read with the unpickler that builds only what DCP metadata holds."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    load_metadata((folder / METADATA).read_bytes(), str(folder / METADATA))
    return FileSystemReader(folder)


def wait_for_ranks(client: Client, folder: str, metadata: Path, timeout: float = 3600.0) -> None:
    """Wait until every blob the coordinator's `.metadata` names is in `folder` on Blob with the bytes it places
    there (each rank uploads its own files from its host's local tier): then `.metadata` may go."""
    needed: dict[str, int] = {}
    for info in load_metadata(metadata.read_bytes(), str(metadata)).storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    deadline = time.monotonic() + timeout
    while True:
        have = {p.name.rsplit("/", 1)[-1]: p.size for p in client.ls(folder)}
        missing = sorted(r for r, end in needed.items() if have.get(r, -1) < end)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise IntegrityError(f"{folder}: the ranks' files {missing[:4]} never landed on Blob: the checkpoint "
                                 "is not complete (no .metadata written)")
        time.sleep(0.5)


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
