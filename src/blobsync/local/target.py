"""Local download targets: safe names under a folder, and partial files written with pwrite then renamed."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from blobsync.errors import DiskFullError, LocalWriteError, TargetBusyError, UnsafeNameError, UnsafeTargetError
from blobsync.local.platform import (
    PositionalFile,
    boot_identifier,
    data_sync,
    extended_path,
    features,
    full_sync,
    lock_file,
)

PART_SUFFIX = ".blobsync-part"
_MAX_NAME_BYTES = 255
WRITE_SLICE = 256 * 1024  # bytes per buffered pwrite of a downloaded block; see PartFile.write_view
_DIRECT_ALIGN = 4096  # offset, length and address alignment that O_DIRECT asks for (4096 covers 512 too)


def direct_io_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether downloads may write with O_DIRECT (Linux). BLOBSYNC_DIRECT_IO=0 turns it off."""
    env = os.environ if env is None else env
    return features(env).direct and env.get("BLOBSYNC_DIRECT_IO", "1").strip().lower() not in ("0", "false", "no")


def _address(view: memoryview) -> int:
    # A throwaway ctypes view of the (writable) buffer: the only portable way to learn where it starts.
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def current_boot_id(env: Mapping[str, str] | None = None) -> str | None:
    """This machine's boot: data written (not yet fsynced) in this boot is still in the page cache, so a killed
    process loses none of it; after a reboot only fsynced data counts. None where the OS does not say.
    BLOBSYNC_BOOT_ID overrides it (tests simulate a power cut with it)."""
    env = os.environ if env is None else env
    if env.get("BLOBSYNC_BOOT_ID"):
        return env["BLOBSYNC_BOOT_ID"]
    return boot_identifier()


_WINDOWS_FORBIDDEN = re.compile(r'[<>:"|?*\x00-\x1f]')
_WINDOWS_RESERVED = frozenset(("CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
                               *(f"LPT{i}" for i in range(1, 10))))


def windows_name_problem(part: str) -> str | None:
    """Why Windows cannot hold `part` as a file or folder name, or None."""
    bad = _WINDOWS_FORBIDDEN.search(part)
    if bad:
        return f"the character {bad.group()!r} is not allowed in Windows names"
    if part.endswith((".", " ")):
        return "Windows drops a trailing dot or space, so the file would get another name"
    if part.split(".", 1)[0].rstrip(" ").upper() in _WINDOWS_RESERVED:
        return f"{part.split('.', 1)[0]!r} is a reserved device name on Windows"
    return None


def safe_join(root: Path, rel: str, *, windows: bool | None = None) -> Path:
    """`root / rel` for a blob-derived relative name, refusing names that escape `root` or are not valid here
    (with `windows`, the default on Windows: also names Windows cannot hold)."""
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
        problem = windows_name_problem(part) if (sys.platform == "win32" if windows is None else windows) else None
        if problem:
            raise UnsafeNameError(f"{rel!r}: {problem}; this blob is not downloaded, the others are")
    if "\\" in rel:
        raise UnsafeNameError(f"{rel!r}: contains a backslash, a path separator on Windows")
    path = root.joinpath(*parts)
    if os.path.commonpath([os.path.abspath(root), os.path.abspath(path)]) != os.path.abspath(root):
        raise UnsafeNameError(f"{rel!r}: resolves outside the target folder")
    return path


def part_path(target: Path) -> Path:
    return target.with_name(target.name + PART_SUFFIX)


_SHARING_VIOLATIONS = (32, 33)  # Windows: ERROR_SHARING_VIOLATION, ERROR_LOCK_VIOLATION


def _write_error(path: Path, exc: OSError) -> LocalWriteError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(
            f"{path}: disk full", hint="free some space, then run the same command again: the download resumes"
        )
    if getattr(exc, "winerror", None) in _SHARING_VIOLATIONS:
        return LocalWriteError(f"{path}: the file is open in another program (sharing violation): close it, then "
                               "run the same command again")
    return LocalWriteError(f"{path}: {exc.strerror or exc}")


# Where the OS opens names relative to a folder descriptor and refuses to follow a last-component link (Linux,
# macOS, the BSDs), a download creates its folders and partial file without following any link below the
# target root: a link planted there cannot send the blob's bytes outside it. Elsewhere (Windows) each folder is
# checked with lstat before use.
_AT_FUNCTIONS = (os.open in os.supports_dir_fd and os.mkdir in os.supports_dir_fd
                 and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY"))
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OWNER = os.geteuid() if hasattr(os, "geteuid") else None  # Windows: the folder's ACL decides


def _link_error(path: Path, what: str = "a symbolic link", verb: str = "write") -> LocalWriteError:
    return UnsafeTargetError(f"{path}: is {what}; refusing to {verb} through it (remove it, then run again)")


def open_folder(root: Path, folders: tuple[str, ...], *, at: bool = _AT_FUNCTIONS) -> int | None:
    """Create `root/folders...` as needed and return a descriptor of the last (None where `at` is off, after
    checking each with lstat). The root is taken as the user named it; no folder below it may be a link."""
    Path(extended_path(str(root))).mkdir(parents=True, exist_ok=True)
    if not at:
        path = root
        for name in folders:
            path = path / name
            with contextlib.suppress(FileExistsError):
                os.mkdir(extended_path(str(path)))
            if not stat.S_ISDIR(os.lstat(extended_path(str(path))).st_mode):
                raise _link_error(path, "a symbolic link or not a folder")
        return None
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    path = root
    try:
        for name in folders:
            path = path / name
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=fd)
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _link_error(path, "a symbolic link or not a folder") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_below(root: Path, rel: str, *, at: bool = _AT_FUNCTIONS) -> bool:
    """Delete the file `root/rel` (a sync's --delete-destination) without following a link below `root`: each
    folder is entered O_NOFOLLOW from the root and the name unlinked in the last (a link there is removed itself,
    never what it points to). False if it was gone already; UnsafeTargetError if a folder on the way is a link."""
    path = safe_join(root, rel)
    folders = path.relative_to(root).parts[:-1]
    if not at:
        here = root
        for name in folders:
            here = here / name
            try:
                if not stat.S_ISDIR(os.lstat(extended_path(str(here))).st_mode):
                    raise _link_error(here, "a symbolic link or not a folder", "delete")
            except FileNotFoundError:
                return False
        return _unlink(extended_path(str(path)), None)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        here = root
        for name in folders:
            here = here / name
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return False
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _link_error(here, "a symbolic link or not a folder", "delete") from None
                raise
            os.close(fd)
            fd = child
        return _unlink(path.name, fd)
    finally:
        os.close(fd)


def _unlink(name: str, folder_fd: int | None) -> bool:
    try:
        if folder_fd is None:
            os.unlink(name)
        else:
            os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        return False
    return True


def _open_part(name: str, path: Path, folder_fd: int | None) -> int:
    """The partial file, opened (created if missing) without following a link; refused if it is not a plain file
    of ours (a link, a device, a hard link to another file)."""
    flags = os.O_RDWR | _NOFOLLOW | getattr(os, "O_BINARY", 0)
    where = {"dir_fd": folder_fd} if folder_fd is not None else {}
    target = name if folder_fd is not None else extended_path(str(path))
    for _ in range(2):  # the second turn: another process created it between our two opens
        try:
            fd = os.open(target, flags, **where)
        except FileNotFoundError:
            try:
                fd = os.open(target, flags | os.O_CREAT | os.O_EXCL, 0o644, **where)
            except FileExistsError:
                continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_error(path) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise _link_error(path, "not a plain file (a device, a folder or a file with other hard links)")
        if _OWNER is not None and st.st_uid != _OWNER:
            # Adopted, it would become the verified file: owned, and writable, by whoever planted it.
            os.close(fd)
            raise UnsafeTargetError(f"{path}: belongs to another user (uid {st.st_uid}); refusing to resume from it "
                                    "(remove it, then run again)")
        return fd
    raise LocalWriteError(f"{path}: created and removed again by another program while opening it")


class PartFile:
    """The partial file beside a download target: sized up front, filled with pwrite, renamed when whole.

    It is locked for the whole download (exclusively; `shared` for the range writers of one cluster job), so a
    second run onto the same file is refused instead of writing the same bytes under the first one's feet, and it
    is renamed only if the name still holds the file written."""

    def __init__(self, target: Path, size: int, *, keep: bool, root: Path | None = None, shared: bool = False
                 ) -> None:
        """Open (and with keep=False, start afresh) the partial file for `target`, creating the folders between
        `root` (default: the target's folder) and it without following links."""
        self.target = target
        self.path = part_path(target)
        self.size = size
        self.fd = self._folder_fd = -1
        root = target.parent if root is None else root
        try:
            folders = target.parent.relative_to(root).parts
            folder_fd = open_folder(root, folders)
            self._folder_fd = -1 if folder_fd is None else folder_fd
            _check_replaceable(target, folder_fd)  # before a byte is fetched
            self.fd = _open_part(self.path.name, self.path, folder_fd)
            if not lock_file(self.fd, shared=shared):
                raise TargetBusyError(f"{target}: another blobsync run is writing this file (its partial file is "
                                      "locked); wait for it to finish or stop it, then run again")
            self.identity = _inode(os.fstat(self.fd))
            self.file = PositionalFile(self.fd, extended_path(str(self.path)), os.O_RDWR | _NOFOLLOW,
                                       not features().positional, self.identity)
            if not keep:
                os.ftruncate(self.fd, 0)
            if os.fstat(self.fd).st_size != size:
                os.ftruncate(self.fd, size)
        except BaseException as exc:
            self._close_fds()
            if isinstance(exc, OSError):
                raise _write_error(self.path, exc) from exc
            raise
        # Whole aligned blocks are written with O_DIRECT where the file system takes it: straight from our buffer
        # to the device, with no copy into the page cache and no page cache to allocate (which, on VMs whose
        # balloon hands free memory back to the host, costs more than the copy), and a big download does not
        # evict everything else from the cache. Any refusal (at open or at a write) turns it off for this file.
        self._direct = direct_io_wanted()
        self._direct_fd = self._read_fd = -1
        if self._direct:  # opened here, not on first use: several worker threads write one file at once
            self._direct_fd = self._reopen(os.O_WRONLY | getattr(os, "O_DIRECT", 0))
            self._direct = self._direct_fd >= 0

    def _reopen(self, flags: int) -> int:
        """A second descriptor of the same file (never of something swapped in under its name), or -1."""
        where = {"dir_fd": self._folder_fd} if self._folder_fd >= 0 else {}
        name = self.path.name if self._folder_fd >= 0 else extended_path(str(self.path))
        try:
            fd = os.open(name, flags | _NOFOLLOW, **where)
        except OSError:
            return -1
        if _inode(os.fstat(fd)) != self.identity:
            os.close(fd)
            return -1
        return fd

    def write_view(self, view: memoryview, offset: int) -> None:
        """Write one buffer at `offset` (called in a worker thread)."""
        try:
            if self._direct and offset % _DIRECT_ALIGN == 0 and len(view) >= _DIRECT_ALIGN:
                done = self._write_direct(view[:len(view) - len(view) % _DIRECT_ALIGN], offset)
                offset += done
                view = view[done:]
            while view:
                # Slices of WRITE_SLICE, not one big pwrite: a multi-MiB write makes the page cache allocate large
                # folios, and on VMs whose balloon reports free memory to the host (Firecracker, some KVM setups)
                # high-order free blocks are exactly the ones the host took back, so every page of them faults on
                # the host. Measured here: 1 GiB in 8 MiB writes cost 1.4-2.9 s of kernel time, in 256 KiB writes
                # 0.27 s. Elsewhere the extra syscalls (4 per MiB) cost nothing measurable.
                n = self.file.write(view[:WRITE_SLICE], offset)
                offset += n
                view = view[n:]
        except OSError as exc:
            raise _write_error(self.path, exc) from exc

    def _write_direct(self, view: memoryview, offset: int) -> int:
        """Write an aligned run with O_DIRECT; returns how much was written (0: not possible here, so the
        caller writes it buffered). Errors other than a refusal of direct I/O (disk full...) propagate."""
        if _address(view) % _DIRECT_ALIGN:
            return 0
        done = 0
        try:
            while done < len(view):
                n = os.pwrite(self._direct_fd, view[done:], offset + done)
                done += n
                if n == 0 or n % _DIRECT_ALIGN:  # a short odd-sized write: finish buffered
                    break
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            self._direct = False  # this file system does not do direct I/O (or not at this alignment)
        return done

    def sync(self) -> None:
        """fdatasync: every range written so far survives a power cut (called in a worker thread)."""
        try:
            data_sync(self.fd)
        except OSError as exc:
            raise _write_error(self.path, exc) from exc

    def read(self, offset: int, length: int) -> bytes:
        return self.file.read(length, offset)

    def read_back(self, view: memoryview, offset: int) -> None:
        """Fill `view` with bytes written at `offset` (by this process or another, in one thread at a time): from
        the device where they went past the page cache (O_DIRECT: a cold buffered read made the page cache
        allocate, which on these VMs cost 2.0 s of CPU per GiB against 0.07 s), else through it."""
        if self._direct and offset % _DIRECT_ALIGN == 0 and _address(view) % _DIRECT_ALIGN == 0:
            if self._read_fd < 0:
                self._read_fd = self._reopen(os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            done, aligned = 0, len(view) - len(view) % _DIRECT_ALIGN
            try:
                while self._read_fd >= 0 and done < aligned:
                    n = os.preadv(self._read_fd, [view[done:aligned]], offset + done)
                    if n <= 0 or n % _DIRECT_ALIGN:  # short or odd: the rest is read through the cache
                        done += max(n, 0)
                        break
                    done += n
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise _write_error(self.path, exc) from exc
            view, offset = view[done:], offset + done
        done = 0
        while done < len(view):
            n = self.file.read_into(view[done:], offset + done)
            if not n:
                raise LocalWriteError(f"{self.path}: partial file is shorter than expected")
            done += n

    def chunks(self, offset: int, length: int) -> Iterator[bytes]:
        """Bytes already on disk (from an earlier run), in order, 8 MiB at a time."""
        step = 8 * 1024 * 1024
        end = offset + length
        while offset < end:
            data = self.file.read(min(step, end - offset), offset)
            if not data:
                raise LocalWriteError(f"{self.path}: partial file is shorter than expected")
            yield data
            offset += len(data)

    def finish(self, mtime_ns: int | None) -> None:
        """fsync, set the mtime, and rename into place: the final name never holds a partial file, and only the
        file this run wrote (still under its name) is renamed."""
        self.seal(mtime_ns)
        self.place()

    def seal(self, mtime_ns: int | None) -> str:
        """fsync and set the mtime: the file as it will be at its final name, named by `placed_mark` (what a
        journal records before the rename, so a run killed right after it finds the file finished)."""
        try:
            full_sync(self.fd)
            if mtime_ns is not None:
                if os.utime in os.supports_fd:
                    os.utime(self.fd, ns=(mtime_ns, mtime_ns))
                else:
                    os.utime(extended_path(str(self.path)), ns=(mtime_ns, mtime_ns))
            return placed_mark(os.fstat(self.fd))
        except OSError as exc:
            self._close_fds()
            raise _write_error(self.target, exc) from exc

    def place(self) -> None:
        """Rename the sealed file to its final name (only the file this run wrote, still under its name)."""
        try:
            self._check_still_ours()
            _check_replaceable(self.target, self._folder_fd if self._folder_fd >= 0 else None)
            if self._folder_fd >= 0:
                os.replace(self.path.name, self.target.name, src_dir_fd=self._folder_fd,
                           dst_dir_fd=self._folder_fd)
            else:
                os.replace(extended_path(str(self.path)), extended_path(str(self.target)))
        except OSError as exc:
            raise _write_error(self.target, exc) from exc
        finally:
            self._close_fds()

    def _check_still_ours(self) -> None:
        try:
            if self._folder_fd >= 0:
                now = os.stat(self.path.name, dir_fd=self._folder_fd, follow_symlinks=False)
            else:
                now = os.lstat(extended_path(str(self.path)))
        except FileNotFoundError:
            now = None
        if now is None or _inode(now) != self.identity:
            raise TargetBusyError(f"{self.path}: the partial file was replaced or removed by another program while "
                                  "it was written; nothing was put at the final name (run again)")

    def _close_fds(self) -> None:
        if getattr(self, "_direct_fd", -1) >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1
        if getattr(self, "_read_fd", -1) >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
        if getattr(self, "file", None) is not None:
            self.file.close_extra()
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1
        if self._folder_fd >= 0:
            os.close(self._folder_fd)
            self._folder_fd = -1

    def close(self) -> None:
        self._close_fds()

    def discard(self) -> None:
        """Remove the partial file (only the one this run wrote), then close it."""
        with contextlib.suppress(OSError, TargetBusyError):
            if self.fd >= 0:
                self._check_still_ours()
                if self._folder_fd >= 0:
                    os.unlink(self.path.name, dir_fd=self._folder_fd)
                else:
                    os.unlink(extended_path(str(self.path)))
        self._close_fds()


def _check_replaceable(target: Path, folder_fd: int | None) -> None:
    """The final name holds nothing, a regular file or a link (replaced, never followed): a device, a FIFO or a
    socket there is refused (as root, `cp URL /dev/null` would replace /dev/null with a file)."""
    try:
        if folder_fd is not None:
            st = os.stat(target.name, dir_fd=folder_fd, follow_symlinks=False)
        else:
            st = os.lstat(extended_path(str(target)))
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise UnsafeTargetError(f"{target}: is a device, a FIFO or a socket, not a file; refusing to replace it "
                                "(download to a file's name)")


def _inode(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def placed_mark(st: os.stat_result) -> str:
    """A finished download's file as it is renamed into place: the same file (device, inode), size and mtime
    after the rename, which keeps all four; a file put there by anyone else differs in one of them."""
    return f"placed {st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def found_placed(target: Path, mark: str) -> bool:
    """Whether `target` is the file `mark` (placed_mark) names, and no partial file is left beside it."""
    try:
        st = os.lstat(extended_path(str(target)))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and placed_mark(st) == mark and not os.path.lexists(part_path(target))
