"""Local download targets: safe names under a folder, and partial files written with pwrite then renamed."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from blobsync.errors import DiskFullError, LocalWriteError, UnsafeNameError

PART_SUFFIX = ".blobsync-part"
_MAX_NAME_BYTES = 255
WRITE_SLICE = 256 * 1024  # bytes per pwrite of a downloaded block; see PartFile.write_view


def current_boot_id(env: Mapping[str, str] | None = None) -> str | None:
    """This machine's boot: data written (not yet fsynced) in this boot is still in the page cache, so a killed
    process loses none of it; after a reboot only fsynced data counts. None where the OS does not say.
    BLOBSYNC_BOOT_ID overrides it (tests simulate a power cut with it)."""
    env = os.environ if env is None else env
    if env.get("BLOBSYNC_BOOT_ID"):
        return env["BLOBSYNC_BOOT_ID"]
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def safe_join(root: Path, rel: str) -> Path:
    """`root / rel` for a blob-derived relative name, refusing names that escape `root` or are not valid here."""
    if not rel or rel.endswith("/"):
        raise UnsafeNameError(f"{rel!r}: not a file name (a folder marker?)")
    if "\x00" in rel:
        raise UnsafeNameError(f"{rel!r}: contains a NUL character")
    if rel.startswith(("/", "\\")) or (len(rel) >= 2 and rel[1] == ":" and rel[0].isalpha()):
        raise UnsafeNameError(f"{rel!r}: an absolute path; refusing to write outside the target folder")
    parts = rel.replace("\\", "/").split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafeNameError(f"{rel!r}: has an empty, '.' or '..' segment; refusing to write outside "
                                  "the target folder")
        if len(part.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
            raise UnsafeNameError(f"{rel!r}: a segment is longer than {_MAX_NAME_BYTES} bytes")
        if part.endswith(PART_SUFFIX):
            raise UnsafeNameError(f"{rel!r}: ends in {PART_SUFFIX}, which blobsync keeps for partial files")
    if "\\" in rel:
        raise UnsafeNameError(f"{rel!r}: contains a backslash, a path separator on Windows")
    path = root.joinpath(*parts)
    if os.path.commonpath([os.path.abspath(root), os.path.abspath(path)]) != os.path.abspath(root):
        raise UnsafeNameError(f"{rel!r}: resolves outside the target folder")
    return path


def part_path(target: Path) -> Path:
    return target.with_name(target.name + PART_SUFFIX)


def _write_error(path: Path, exc: OSError) -> LocalWriteError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(
            f"{path}: disk full", hint="free some space, then run the same command again: the download resumes"
        )
    return LocalWriteError(f"{path}: {exc.strerror or exc}")


class PartFile:
    """The partial file beside a download target: sized up front, filled with pwrite, renamed when whole."""

    def __init__(self, target: Path, size: int, *, keep: bool) -> None:
        """Open (and with keep=False, start afresh) the partial file for `target`."""
        self.target = target
        self.path = part_path(target)
        self.size = size
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_CREAT | (0 if keep else os.O_TRUNC)
            self.fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise _write_error(self.path, exc) from exc
        try:
            if os.fstat(self.fd).st_size != size:
                os.ftruncate(self.fd, size)
        except OSError as exc:
            os.close(self.fd)
            raise _write_error(self.path, exc) from exc

    def write_view(self, view: memoryview, offset: int) -> None:
        """Write one buffer at `offset` (called in a worker thread)."""
        try:
            while view:
                # Slices of WRITE_SLICE, not one big pwrite: a multi-MiB write makes the page cache allocate large
                # folios, and on VMs whose balloon reports free memory to the host (Firecracker, some KVM setups)
                # high-order free blocks are exactly the ones the host took back, so every page of them faults on
                # the host. Measured here: 1 GiB in 8 MiB writes cost 1.4-2.9 s of kernel time, in 256 KiB writes
                # 0.27 s. Elsewhere the extra syscalls (4 per MiB) cost nothing measurable.
                n = os.pwrite(self.fd, view[:WRITE_SLICE], offset)
                offset += n
                view = view[n:]
        except OSError as exc:
            raise _write_error(self.path, exc) from exc

    def sync(self) -> None:
        """fdatasync: every range written so far survives a power cut (called in a worker thread)."""
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise _write_error(self.path, exc) from exc

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def md5_of_range(self, hasher: hashlib._Hash, offset: int, length: int) -> None:
        """Feed bytes already on disk (from an earlier run) to the whole-file hash, in order."""
        step = 8 * 1024 * 1024
        end = offset + length
        while offset < end:
            data = os.pread(self.fd, min(step, end - offset), offset)
            if not data:
                raise LocalWriteError(f"{self.path}: partial file is shorter than expected")
            hasher.update(data)
            offset += len(data)

    def finish(self, mtime_ns: int | None) -> None:
        """fsync, set the mtime, and rename into place: the final name never holds a partial file."""
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            if mtime_ns is not None:
                os.utime(self.path, ns=(mtime_ns, mtime_ns))
            os.replace(self.path, self.target)
        except OSError as exc:
            raise _write_error(self.target, exc) from exc

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def discard(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
