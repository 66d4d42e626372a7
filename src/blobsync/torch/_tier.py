"""The local tier of Checkpoints: each step written to a local folder first (what training waits for), its upload
to Blob owed until done. A small state file per rank (`.blobsync-<rank>`) says the rank's local files are whole
and whether their upload is done, so that a process killed during an upload has it finished by the next one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from blobsync.engine.digest import md5_of_file
from blobsync.errors import UsageError
from blobsync.local.platform import full_sync

log = logging.getLogger("blobsync")
_STATE = ".blobsync-{rank}"


class LocalTier:
    """Step folders under `root` (the same names as on Blob), for one rank."""

    def __init__(self, root: str | os.PathLike[str], rank: int) -> None:
        if not isinstance(root, str | os.PathLike):
            raise UsageError(f"invalid local_dir={root!r}: a local folder path")
        self.root = Path(root)
        self.rank = rank
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"local_dir {str(self.root)!r} cannot be made: {exc.strerror or exc}") from None

    def folder(self, folder_name: str) -> Path:
        return self.root / folder_name.rstrip("/")

    def _state(self, folder_name: str) -> Path:
        return self.folder(folder_name) / _STATE.format(rank=self.rank)

    def fresh(self, folder_name: str) -> Path:
        """An empty folder for a step (an earlier attempt's files gone)."""
        self.discard(folder_name)
        folder = self.folder(folder_name)
        folder.mkdir(parents=True)
        return folder

    def discard_state(self, folder_name: str) -> None:
        """This rank's files of the step are no longer vouched for (they are being written again)."""
        with contextlib.suppress(FileNotFoundError):
            self._state(folder_name).unlink()

    def written(self, folder_name: str) -> None:
        """This rank's local files of the step are whole (durably): their upload is owed."""
        self._mark(folder_name, uploaded=False)

    def uploaded(self, folder_name: str, landed: dict[str, str | None]) -> None:
        """The rank's upload is done: `landed` names each file uploaded and its blob's ETag, kept with the file's
        size and mtime (what `same` compares, with no hashing)."""
        files: dict[str, list[object]] = {}
        for relative, etag in landed.items():
            with contextlib.suppress(OSError):
                st = (self.folder(folder_name) / relative).stat()
                files[relative] = [st.st_size, st.st_mtime_ns, etag]
        self._mark(folder_name, uploaded=True, files=files)

    def same(self, folder_name: str, relative: str, size: int, etag: str | None) -> bool | None:
        """Whether the local file is the blob of `etag` and `size` as uploaded from this host (None: no rank here
        recorded it)."""
        for path in self.folder(folder_name).glob(_STATE.format(rank="*")):
            recorded = (self._read(path) or {}).get("files")
            entry = recorded.get(relative) if isinstance(recorded, dict) else None
            if isinstance(entry, list) and len(entry) == 3:
                try:
                    st = (self.folder(folder_name) / relative).stat()
                except OSError:
                    return False
                return entry[:2] == [st.st_size, st.st_mtime_ns] and st.st_size == size and \
                    _unquoted(entry[2]) == _unquoted(etag)
        return None

    def _mark(self, folder_name: str, *, uploaded: bool, files: dict[str, list[object]] | None = None) -> None:
        folder = self.folder(folder_name)
        if not uploaded:  # the files first, then the state that vouches for them
            for path in folder.iterdir():
                if path.is_file():
                    _fsync(path)
        tmp = self._state(folder_name).with_suffix(".tmp")
        tmp.write_text(json.dumps({"uploaded": uploaded, **({"files": files} if files else {})}))
        _fsync(tmp)
        tmp.replace(self._state(folder_name))
        _fsync(folder)

    def owed(self) -> list[str]:
        """The step folders whose local files are whole and whose upload is not done, oldest first."""
        return sorted(name + "/" for name, state in self._states() if state.get("uploaded") is False)

    def whole(self, folder_name: str) -> bool:
        """Whether the step's local files are whole (written, uploaded or not)."""
        return self._read(self._state(folder_name)) is not None

    def _states(self) -> Iterable[tuple[str, dict[str, object]]]:
        for path in sorted(self.root.glob("step-*/" + _STATE.format(rank=self.rank))):
            state = self._read(path)
            if state is not None:
                yield path.parent.name, state

    @staticmethod
    def _read(path: Path) -> dict[str, object] | None:
        try:
            state = json.loads(path.read_bytes()[:1 << 20])
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def steps(self) -> list[str]:
        """Every step folder here (whole or not), by name."""
        return sorted(p.name + "/" for p in self.root.glob("step-*") if p.is_dir())

    def discard(self, folder_name: str) -> None:
        folder = self.folder(folder_name)
        if folder.exists():
            # The state file first: a folder half deleted is never taken for whole.
            with contextlib.suppress(FileNotFoundError):
                self._state(folder_name).unlink()
            shutil.rmtree(folder, ignore_errors=True)

    def md5(self, folder_name: str, relative: str) -> tuple[int, bytes] | None:
        """The size and MD5 of one local file of a step (None: not there)."""
        path = self.folder(folder_name) / relative
        try:
            return path.stat().st_size, md5_of_file(path)
        except OSError:
            return None


def _unquoted(etag: object) -> str | None:
    """An ETag as a listing gives it (a response header quotes it)."""
    return etag.strip('"') if isinstance(etag, str) else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        full_sync(fd)
    finally:
        os.close(fd)
