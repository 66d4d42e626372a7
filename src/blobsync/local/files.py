"""Local source files: stat identity, positional reads into reusable buffers, and tree walking."""

from __future__ import annotations

import errno
import os
import stat
import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Protocol

from blobsync.errors import SourceChangedError, SourceError, UsageError
from blobsync.local.platform import PositionalFile, extended_path, features, open_positional
from blobsync.redact import printable

INLINE_READ_MAX = 64 * 1024  # files up to this size are read and hashed on the event loop when cached


@dataclass(frozen=True)
class FileIdentity:
    """What tells us a file is still the one we started with."""

    size: int
    mtime_ns: int
    inode: int
    # The inode change time: a rewrite in place that puts the mtime back (rsync --times, cp -p, a checkpoint
    # writer restoring times) still moves it, and no one can set it back.
    ctime_ns: int = 0

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_size, clamp_ns(st.st_mtime_ns), st.st_ino, clamp_ns(st.st_ctime_ns))


def clamp_ns(ns: int) -> int:
    """A file time as a signed 64-bit count of nanoseconds (1677 to 2262), what the journal and blob metadata
    keep: a file touched to the year 2300 is taken as of 2262, the same on every run, so it compares stably."""
    return min(max(ns, -(2**63)), 2**63 - 1)


@dataclass(frozen=True)
class SourceFile:
    where: str  # absolute path (a Path is made only when asked for: a walk of 10^6 files spent 2 µs a file on it)
    rel: str  # relative path with '/' between folders
    identity: FileIdentity

    @property
    def path(self) -> Path:
        return Path(self.where)

    @property
    def blob_rel(self) -> str:
        """The relative name as the blob service stores it: Azure turns a '\\' in a blob name into '/' (and, on
        macOS, the name in NFC)."""
        return blob_rel(self.rel)


# macOS file systems hand out names decomposed (HFS+ stores NFD; APFS keeps either but treats them as one), while
# Azure keeps a name's exact bytes: compared and stored as NFC, a file keeps one blob name wherever it was written.
NFC_NAMES = sys.platform == "darwin"


def blob_rel(rel: str) -> str:
    name = rel.replace("\\", "/")
    return unicodedata.normalize("NFC", name) if NFC_NAMES else name


def local_rel(rel: str) -> str:
    """A local relative name as a download sync compares it with blob names (NFC on macOS)."""
    return unicodedata.normalize("NFC", rel) if NFC_NAMES else rel


@dataclass(frozen=True)
class SkippedEntry:
    path: Path
    rel: str  # printable: undecodable bytes escaped
    reason: str
    failed: bool = True  # False: a note (a symbolic link or a loop left out on purpose), not a failure


def _os_error_text(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def stat_file(path: Path) -> FileIdentity:
    """Stat a source file; SourceError if it is missing, unreadable or not a regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SourceError(f"{printable(str(path))}: {_os_error_text(exc)}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise SourceError(f"{printable(str(path))}: not a regular file")
    return FileIdentity.of(st)


@dataclass(frozen=True)
class _Folder:
    path: Path
    rel: str  # with a trailing '/', or '' for the root
    key: tuple[int, int]  # (st_dev, st_ino)
    parent: _Folder | None  # the chain of folders above: a loop is a folder that is its own ancestor

    def is_below(self, key: tuple[int, int]) -> bool:
        folder: _Folder | None = self
        while folder is not None:
            if folder.key == key:
                return True
            folder = folder.parent
        return False


def walk(root: Path, *, follow_symlinks: bool = False, enters: Callable[[str], bool] = lambda rel: True
         ) -> Iterator[SourceFile | SkippedEntry]:
    """Yield every regular file under `root` (sorted, depth first) and every entry that had to be skipped;
    a folder (relative path, no trailing '/') for which `enters` says False is not listed at all.

    With `follow_symlinks`, a link to a folder that contains it (a loop) is skipped with a note, as rclone
    and AzCopy do: each folder is entered at most once per path from the root, so the walk ends."""
    st = os.stat(root)
    stack = [_Folder(root, "", (st.st_dev, st.st_ino), None)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder.path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            yield SkippedEntry(folder.path, printable(folder.rel) or ".",
                               f"cannot list folder: {_os_error_text(exc)}")
            continue
        subfolders: list[_Folder] = []
        for entry in entries:
            item = _visit(entry, folder, follow_symlinks)
            if isinstance(item, _Folder):
                if enters(item.rel[:-1]):
                    subfolders.append(item)
            elif item is not None:
                yield item
        stack.extend(reversed(subfolders))


def _visit(entry: os.DirEntry[str], folder: _Folder, follow_symlinks: bool
           ) -> SourceFile | SkippedEntry | _Folder | None:
    rel = f"{folder.rel}{entry.name}"
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return SkippedEntry(Path(entry.path), printable(rel), "the name is not valid UTF-8, so it cannot be a blob "
                            "name: rename it (e.g. with convmv)")
    try:
        if entry.is_symlink() and not follow_symlinks:
            return SkippedEntry(Path(entry.path), rel, "symbolic link skipped (use --follow-symlinks)",
                                failed=False)
        if entry.is_dir(follow_symlinks=follow_symlinks):
            st = entry.stat(follow_symlinks=follow_symlinks)
            key = (st.st_dev, st.st_ino)
            if folder.is_below(key):
                target = os.readlink(entry.path) if entry.is_symlink() else entry.name
                return SkippedEntry(Path(entry.path), rel, f"symbolic link to {printable(target)!r} makes a loop (it "
                                    "leads back to a folder above it): not followed", failed=False)
            return _Folder(Path(entry.path), rel + "/", key, folder)
        st = entry.stat(follow_symlinks=follow_symlinks)
    except OSError as exc:
        return SkippedEntry(Path(entry.path), printable(rel), _os_error_text(exc))
    if not stat.S_ISREG(st.st_mode):
        return SkippedEntry(Path(entry.path), printable(rel), "not a regular file")
    if "\\" in entry.name and _twin(folder, rel):
        return SkippedEntry(Path(entry.path), printable(rel), f"{blob_rel(rel)!r} exists too, and both would be the "
                            "same blob (Azure stores '\\' in a blob name as '/'): rename one of them")
    return SourceFile(entry.path, rel, FileIdentity.of(st))


def _twin(folder: _Folder, rel: str) -> bool:
    """Whether the path a backslash name turns into on the service is a file of this tree as well."""
    root = folder
    while root.parent is not None:
        root = root.parent
    return root.path.joinpath(*blob_rel(rel).split("/")).is_file()


def check_source(path: Path, recursive: bool) -> None:
    """Fail early, as a usage error, when the source cannot be what the command needs."""
    if not path.exists():
        raise UsageError(f"source {str(path)!r} does not exist")
    if path.is_dir() and not recursive:
        raise UsageError(f"source {str(path)!r} is a folder: pass -r/--recursive to upload its contents")


class Source(Protocol):
    """What an upload reads: a file opened by OpenFile, or bytes in memory (engine/sources.py)."""

    @property
    def path(self) -> PurePath: ...  # for messages and the content type guess

    @property
    def opened(self) -> FileIdentity: ...  # as it was when opened

    def identity(self) -> FileIdentity: ...

    def read_into(self, buf: memoryview, offset: int) -> None: ...

    def read_all(self, size: int) -> bytes: ...

    def read_all_cached(self, size: int) -> bytearray | None: ...


def _open_below(root: Path, path: Path, nofollow: int) -> PositionalFile:
    """`path` opened from `root` one folder at a time, none of them through a link (a folder swapped for one after
    the walk would otherwise lead the open elsewhere); the descriptor is of the file the names lead to."""
    *folders, name = path.relative_to(root).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for folder in folders:
            try:
                child = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fd)
            except NotADirectoryError:  # a link to a folder, refused by O_NOFOLLOW (or a file swapped in)
                raise OSError(errno.ELOOP, "a symbolic link") from None
            os.close(fd)
            fd = child
        opened = os.open(name, os.O_RDONLY | nofollow, dir_fd=fd)
    finally:
        os.close(fd)
    st = os.fstat(opened)
    return PositionalFile(opened, extended_path(str(path)), os.O_RDONLY | nofollow, not features().positional,
                          (st.st_dev, st.st_ino))


class OpenFile:
    """An open source file read at offsets: many threads may read different offsets at once.

    A file found by a walk is opened as the walk saw it: `walked` is the inode it listed, and without
    `follow_symlinks` a link swapped in since (to a secret elsewhere) is refused at the open (O_NOFOLLOW where the
    OS has it; the inode check everywhere)."""

    def __init__(self, path: Path, *, walked: int | None = None, follow_symlinks: bool = True,
                 root: Path | None = None) -> None:
        self.path = path
        nofollow = 0 if follow_symlinks or walked is None else getattr(os, "O_NOFOLLOW", 0)
        try:
            if walked is not None and not follow_symlinks and os.path.islink(path):
                raise OSError(errno.ELOOP, "")
            below = root is not None and nofollow and os.open in os.supports_dir_fd and root in path.parents
            self.file = _open_below(root, path, nofollow) if below and root is not None else \
                open_positional(str(path), os.O_RDONLY | nofollow)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SourceChangedError(f"{printable(str(path))}: is a symbolic link now (a file when listed): not "
                                         "uploaded (links are skipped; use --follow-symlinks)") from None
            raise SourceError(f"{path}: {_os_error_text(exc)}") from exc
        self.fd = self.file.fd
        self._nowait = features().nowait
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            raise SourceError(f"{path}: not a regular file")
        if walked and st.st_ino != walked:
            self.file.close_extra()
            os.close(self.fd)
            raise SourceChangedError(f"{printable(str(path))}: is another file than the one listed (replaced since "
                                     "the walk): not uploaded; run again to upload what is there now")
        self.opened = FileIdentity.of(st)  # the file as it was when opened

    def identity(self) -> FileIdentity:
        return FileIdentity.of(os.fstat(self.fd))

    def read_into(self, buf: memoryview, offset: int) -> None:
        """Fill `buf` from `offset` (in a worker thread); a file that ends early changed under us."""
        done = 0
        size = len(buf)
        try:
            while done < size:
                n = self.file.read_into(buf[done:], offset + done)
                if n == 0:
                    raise SourceChangedError(f"{self.path}: file changed (it shrank) while it was being read")
                done += n
        except OSError as exc:
            raise SourceError(f"{self.path}: {_os_error_text(exc)}") from exc

    def read_all(self, size: int) -> bytes:
        """Read a small file whole. A size change is reported as SourceError."""
        try:
            data = self.file.read(size + 1, 0)
        except OSError as exc:
            raise SourceError(f"{self.path}: {_os_error_text(exc)}") from exc
        if len(data) != size:
            raise SourceChangedError(f"{self.path}: file changed size while it was being read")
        return data

    def read_all_cached(self, size: int) -> bytearray | None:
        """Like read_all, but only if the whole file is in the page cache: a read that would wait for the disk
        is refused (RWF_NOWAIT) and this returns None, so the caller can do it in a worker thread instead of
        stalling the event loop. None also where the OS cannot read without waiting."""
        if self._nowait is None:
            return None
        buf = bytearray(size + 1)
        try:
            n = os.preadv(self.fd, [buf], 0, self._nowait)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return None
            raise SourceError(f"{self.path}: {_os_error_text(exc)}") from exc
        if n != size:  # partly cached, or the size changed: read_all tells which
            return None
        del buf[size:]
        return buf

    def close(self) -> None:
        self.file.close_extra()
        os.close(self.fd)

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def looks_cold(path: Path) -> bool:
    """Whether the start of this file is not in the page cache (a one-byte read that refuses to wait)."""
    nowait = features().nowait
    if nowait is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.preadv(fd, [bytearray(1)], 0, nowait)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def will_need(paths: Sequence[Path]) -> None:
    """Ask the kernel to start reading these files into the page cache, without waiting for it (WILLNEED)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None or not features().fadvise:
        return
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def warm_if_cold(batch: Sequence[tuple[Path, int]], submit: Callable[[Callable[[], None]], object]) -> bool:
    """Before a batch of (path, size) is uploaded: if a sample of its small files is not in the page cache, have
    a worker thread ask the kernel to read all of them ahead (`submit` runs a function in one).

    A small file in the cache is read on the event loop; one that is not costs a hop to a worker thread and
    back, ~0.2 ms of CPU each (2,000 cold 16 KiB files: 1.1-1.3 s of CPU against 0.85 warm). Read ahead, they
    are in the cache by the time their turn comes. A warm tree pays three one-byte reads per batch."""
    small = [path for path, size in batch if 0 < size <= INLINE_READ_MAX]
    if not small or not any(looks_cold(p) for p in {small[0], small[len(small) // 2], small[-1]}):
        return False
    submit(lambda: will_need(small))
    return True
